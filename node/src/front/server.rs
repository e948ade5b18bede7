//! Accepting client connections.

use super::handlers;
use crate::serve::state::SharedState;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// Serves until `stop` turns true, then stops accepting and waits (up to `drain`) for open
/// connections to finish their requests.
pub async fn serve(
    state: SharedState,
    listener: TcpListener,
    mut stop: watch::Receiver<bool>,
    drain: Duration,
) {
    let graceful = GracefulShutdown::new();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stop.wait_for(|stop| *stop) => break,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                // Out of file descriptors and the like: back off instead of spinning.
                tracing::warn!(%error, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        if let Err(error) = stream.set_nodelay(true) {
            tracing::debug!(%peer, %error, "TCP_NODELAY");
        }
        let service_state = state.clone();
        let service = service_fn(move |request| handlers::handle(service_state.clone(), request));
        // The timer bounds how long a client may take to send a request's headers (hyper
        // reads them; without a timer it cannot time them out, and a client that opens a
        // connection and trickles a header would hold it forever).
        let connection = http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(state.config.client_timeout)
            .keep_alive(true)
            .serve_connection(TokioIo::new(stream), service);
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%peer, %error, "client connection ended with an error");
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(drain, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("drain timeout: closing the remaining client connections");
    }
}
