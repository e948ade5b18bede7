//! A child process owned by a test: started with piped output, ready when it prints its
//! readiness line, drained in the background so its pipes never fill, and killed on drop so no
//! process outlives the test, even one that panics.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Lines of output kept per process (older lines are dropped; a chatty process cannot grow
/// the test's memory without bound).
const KEPT_LINES: usize = 20_000;
/// Lines of output shown when a test panics while the process is alive.
const SHOWN_LINES_ON_PANIC: usize = 80;

/// Which pipe a line came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pipe {
    Stdout,
    Stderr,
}

/// The recent output of a process, both pipes interleaved in arrival order.
#[derive(Default)]
struct OutputLog {
    lines: Mutex<VecDeque<(Pipe, String)>>,
}

impl OutputLog {
    /// The kept lines; a reader thread that panicked leaves them readable.
    fn lines(&self) -> MutexGuard<'_, VecDeque<(Pipe, String)>> {
        self.lines
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn push(&self, pipe: Pipe, line: String) {
        let mut lines = self.lines();
        if lines.len() == KEPT_LINES {
            lines.pop_front();
        }
        lines.push_back((pipe, line));
    }

    fn tail(&self, count: usize) -> String {
        let lines = self.lines();
        let skip = lines.len().saturating_sub(count);
        let mut text = String::new();
        for (pipe, line) in lines.iter().skip(skip) {
            let tag = match pipe {
                Pipe::Stdout => "out",
                Pipe::Stderr => "err",
            };
            text.push_str(&format!("  [{tag}] {line}\n"));
        }
        text
    }
}

/// A running child process that is killed (SIGKILL) and reaped when dropped.
pub struct ManagedProcess {
    name: String,
    child: Child,
    exit: Option<ExitStatus>,
    output: Arc<OutputLog>,
    readers: Vec<JoinHandle<()>>,
    /// Set once the output was shown in a panic message, so drop does not print it twice.
    output_reported: bool,
}

impl ManagedProcess {
    /// Starts `command` and waits up to `ready_timeout` for a stdout line starting with
    /// `ready_prefix`; returns the process and that line. Panics, with the process's output in
    /// the message, if the process exits or stays silent instead.
    pub fn start(
        name: &str,
        command: Command,
        ready_prefix: &str,
        ready_timeout: Duration,
    ) -> (Self, String) {
        let (stdout_lines, stdout_rx) = mpsc::channel();
        let mut process = Self::launch(name, command, Some(stdout_lines));
        let deadline = Instant::now() + ready_timeout;
        loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            match stdout_rx.recv_timeout(remaining) {
                Ok(line) if line.starts_with(ready_prefix) => return (process, line),
                Ok(_) => continue,
                Err(RecvTimeoutError::Timeout) => {
                    process.kill9();
                    process.fail(&format!(
                        "no line starting with {ready_prefix:?} on stdout within {ready_timeout:?}"
                    ));
                }
                Err(RecvTimeoutError::Disconnected) => {
                    let status = process.wait_exit(Duration::from_secs(5));
                    // Stdout closed first; what the process wrote to stderr before exiting may
                    // still be in the pipe: let the readers reach end of file (bounded, in case
                    // a child of the process keeps the pipe open).
                    process.wait_readers(Duration::from_secs(2));
                    process.fail(&format!(
                        "exited ({status:?}) before printing a line starting with {ready_prefix:?}"
                    ));
                }
            }
        }
    }

    /// Starts `command` without waiting for anything: for a process whose readiness is told
    /// some other way (e.g. an HTTP health check), see [`crate::vllm`].
    pub fn spawn(name: &str, command: Command) -> Self {
        Self::launch(name, command, None)
    }

    /// Starts `command` with piped output drained into the log (stdout lines also into
    /// `stdout_lines`, when given).
    fn launch(name: &str, mut command: Command, stdout_lines: Option<Sender<String>>) -> Self {
        command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command
            .spawn()
            .unwrap_or_else(|error| panic!("{name}: cannot start {command:?}: {error}"));
        let output = Arc::new(OutputLog::default());
        let mut readers = Vec::new();
        if let Some(stdout) = child.stdout.take() {
            readers.push(drain(
                stdout,
                Pipe::Stdout,
                Arc::clone(&output),
                stdout_lines,
            ));
        }
        if let Some(stderr) = child.stderr.take() {
            readers.push(drain(stderr, Pipe::Stderr, Arc::clone(&output), None));
        }
        ManagedProcess {
            name: name.to_string(),
            child,
            exit: None,
            output,
            readers,
            output_reported: false,
        }
    }

    /// The name given at start, used in messages.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The operating system's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the process is still running (reaps it if it has exited).
    pub fn is_running(&mut self) -> bool {
        if self.exit.is_some() {
            return false;
        }
        match self.child.try_wait() {
            Ok(Some(status)) => {
                self.exit = Some(status);
                false
            }
            Ok(None) => true,
            Err(_) => false,
        }
    }

    /// Kills the process with SIGKILL and reaps it. Idempotent.
    pub fn kill9(&mut self) {
        if self.is_running() {
            // An error means it exited in between; `wait` below reaps it either way.
            let _ = self.child.kill();
            if let Ok(status) = self.child.wait() {
                self.exit = Some(status);
            }
        }
    }

    /// Sends SIGTERM (a graceful stop request) without waiting; see [`Self::wait_exit`].
    pub fn sigterm(&mut self) {
        self.signal("TERM");
    }

    /// Sends SIGHUP (`kvmesh serve` reloads its TLS files) without waiting.
    pub fn sighup(&mut self) {
        self.signal("HUP");
    }

    /// Freezes the process (SIGSTOP), as a long GC pause or a starved CPU would.
    pub fn sigstop(&mut self) {
        self.signal("STOP");
    }

    /// Resumes a process frozen by [`Self::sigstop`].
    pub fn sigcont(&mut self) {
        self.signal("CONT");
    }

    fn signal(&mut self, signal: &str) {
        // The child is not reaped until `exit` is set, so its pid cannot have been reused.
        if self.is_running() {
            let status = send_signal(self.pid(), signal).unwrap_or_else(|error| {
                panic!("{}: cannot run `kill -{signal}`: {error}", self.name)
            });
            assert!(
                status.success() || !self.is_running(),
                "{}: `kill -{signal}` failed",
                self.name
            );
        }
    }

    /// Waits up to `timeout` for the process to exit; its status, or `None` if still running.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if !self.is_running() {
                return self.exit;
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The last `lines` lines of output, both pipes, tagged.
    pub fn output_tail(&self, lines: usize) -> String {
        self.output.tail(lines)
    }

    /// The first output line so far that starts with `prefix`.
    pub fn output_line(&self, prefix: &str) -> Option<String> {
        let lines = self.output.lines();
        lines
            .iter()
            .find(|(_, line)| line.starts_with(prefix))
            .map(|(_, line)| line.clone())
    }

    /// Every kept line of one pipe, oldest first.
    pub fn output_lines(&self, pipe: Pipe) -> Vec<String> {
        let lines = self.output.lines();
        lines
            .iter()
            .filter(|(from, _)| *from == pipe)
            .map(|(_, line)| line.clone())
            .collect()
    }

    /// Whether any output line so far contains `needle`.
    pub fn output_contains(&self, needle: &str) -> bool {
        let lines = self.output.lines();
        lines.iter().any(|(_, line)| line.contains(needle))
    }

    /// Waits up to `timeout` for the output readers to reach end of file.
    fn wait_readers(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while self.readers.iter().any(|reader| !reader.is_finished()) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Panics with `reason` and the recent output of the process.
    pub fn fail(&mut self, reason: &str) -> ! {
        self.output_reported = true;
        panic!(
            "{} (pid {}): {reason}\n--- recent output of {} ---\n{}",
            self.name,
            self.pid(),
            self.name,
            self.output.tail(SHOWN_LINES_ON_PANIC)
        );
    }
}

impl Drop for ManagedProcess {
    fn drop(&mut self) {
        self.kill9();
        // The pipes close with the process, so the readers finish promptly.
        for reader in self.readers.drain(..) {
            let _ = reader.join();
        }
        if std::thread::panicking() && !self.output_reported {
            eprintln!(
                "--- recent output of {} (pid {}, {:?}) ---\n{}",
                self.name,
                self.child.id(),
                self.exit,
                self.output.tail(SHOWN_LINES_ON_PANIC)
            );
        }
    }
}

/// Copies `pipe` line by line into `log` (and into `lines`, if given) until it closes.
fn drain(
    pipe: impl Read + Send + 'static,
    which: Pipe,
    log: Arc<OutputLog>,
    lines: Option<Sender<String>>,
) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(pipe);
        let mut buffer = Vec::new();
        loop {
            buffer.clear();
            match reader.read_until(b'\n', &mut buffer) {
                Ok(0) | Err(_) => return,
                Ok(_) => {
                    let line = String::from_utf8_lossy(&buffer).trim_end().to_string();
                    if let Some(lines) = &lines {
                        // The receiver is gone once the process is ready; keep logging anyway.
                        let _ = lines.send(line.clone());
                    }
                    log.push(which, line);
                }
            }
        }
    })
}

/// What a finished command printed.
#[derive(Debug)]
pub struct Finished {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `command` to completion within `timeout` (killed and reported otherwise).
pub fn run_to_completion(mut command: Command, timeout: Duration) -> Finished {
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let description = format!("{command:?}");
    let mut child = command
        .spawn()
        .unwrap_or_else(|error| panic!("cannot start {description}: {error}"));
    let collect = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut text = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut text);
            }
            String::from_utf8_lossy(&text).into_owned()
        })
    };
    let stdout = collect(
        child
            .stdout
            .take()
            .map(|pipe| Box::new(pipe) as Box<dyn Read + Send>),
    );
    let stderr = collect(
        child
            .stderr
            .take()
            .map(|pipe| Box::new(pipe) as Box<dyn Read + Send>),
    );
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{description} did not finish within {timeout:?}");
            }
            Err(error) => panic!("waiting for {description}: {error}"),
        }
    };
    Finished {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    }
}

/// Runs `kill -SIGNAL PID`. For a child of this process that is not reaped yet the pid is
/// still its own; [`ManagedProcess`]'s own signals go through here.
pub fn send_signal(pid: u32, signal: &str) -> std::io::Result<std::process::ExitStatus> {
    Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
}
