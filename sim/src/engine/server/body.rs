//! The response body type: a whole buffer or a stream of SSE frames.

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, combinators::BoxBody};

/// Response body of every handler.
pub type Body = BoxBody<Bytes, Infallible>;

/// A body holding `bytes`.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).boxed()
}

/// An empty body.
pub fn empty() -> Body {
    full(Bytes::new())
}
