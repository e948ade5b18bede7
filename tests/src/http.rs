//! A small blocking HTTP/1.1 client for the tests.
//!
//! Every request opens its own connection (`Connection: close`), sets TCP_NODELAY, and runs
//! under one deadline covering connect, write and every read, so no call can hang a test. The
//! response body is decoded (fixed length, chunked or until close) either at once
//! ([`Request::send`]) or incrementally ([`Request::open`]), which is what SSE tests need.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// The default bound of one call, connection to last byte.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(15);
/// The largest response head accepted.
const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Size of the chunks of a request body sent with chunked transfer encoding.
const REQUEST_CHUNK_BYTES: usize = 4096;

/// An HTTP request to send to a loopback server.
#[derive(Debug, Clone)]
pub struct Request {
    method: String,
    path: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    chunked: bool,
    timeout: Duration,
}

impl Request {
    pub fn new(method: &str, path: &str) -> Self {
        Request {
            method: method.to_string(),
            path: path.to_string(),
            headers: Vec::new(),
            body: Vec::new(),
            chunked: false,
            timeout: DEFAULT_TIMEOUT,
        }
    }

    pub fn get(path: &str) -> Self {
        Self::new("GET", path)
    }

    /// A POST with `body` sent as is, labelled `application/json` (bodies need not be valid).
    pub fn post(path: &str, body: impl Into<Vec<u8>>) -> Self {
        let mut request = Self::new("POST", path);
        request.body = body.into();
        request.header("content-type", "application/json")
    }

    pub fn post_json(path: &str, body: &serde_json::Value) -> Self {
        Self::post(path, body.to_string())
    }

    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_string(), value.to_string()));
        self
    }

    /// `Authorization: Bearer KEY`.
    pub fn bearer(self, key: &str) -> Self {
        self.header("authorization", &format!("Bearer {key}"))
    }

    /// Sends the body with `Transfer-Encoding: chunked` instead of `Content-Length`.
    pub fn chunked(mut self) -> Self {
        self.chunked = true;
        self
    }

    /// Bounds the whole call (connect, write, reading the whole response).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sends the request and reads the whole response.
    pub fn send(&self, addr: SocketAddr) -> io::Result<Response> {
        let started = Instant::now();
        let mut open = self.open(addr)?;
        let mut body = Vec::new();
        open.read_to_end(&mut body)?;
        Ok(Response {
            status: open.status,
            headers: open.headers,
            body,
            elapsed: started.elapsed(),
        })
    }

    /// Sends the request and returns once the response head arrived; the body is read from the
    /// returned value as it arrives. Dropping it closes the connection.
    pub fn open(&self, addr: SocketAddr) -> io::Result<OpenResponse> {
        self.start(addr)?.finish()
    }

    /// Connects and sends the request without reading anything back; dropping the result
    /// hangs up, which is how tests play a client that goes away.
    pub fn start(&self, addr: SocketAddr) -> io::Result<SentRequest> {
        let deadline = Instant::now() + self.timeout;
        let stream = TcpStream::connect_timeout(&addr, self.timeout)?;
        stream.set_nodelay(true)?;
        stream.set_write_timeout(Some(self.timeout))?;
        let write_result = self.write_to(&stream, addr);
        Ok(SentRequest {
            method: self.method.clone(),
            stream: DeadlineStream { stream, deadline },
            write_result,
        })
    }

    fn write_to(&self, mut stream: &TcpStream, addr: SocketAddr) -> io::Result<()> {
        let mut head = format!(
            "{} {} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n",
            self.method, self.path
        );
        for (name, value) in &self.headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        if self.chunked {
            head.push_str("transfer-encoding: chunked\r\n\r\n");
        } else if !self.body.is_empty() || self.method != "GET" {
            head.push_str(&format!("content-length: {}\r\n\r\n", self.body.len()));
        } else {
            head.push_str("\r\n");
        }
        if !self.chunked {
            let mut message = head.into_bytes();
            message.extend_from_slice(&self.body);
            return stream.write_all(&message);
        }
        stream.write_all(head.as_bytes())?;
        for chunk in self.body.chunks(REQUEST_CHUNK_BYTES) {
            let mut framed = format!("{:x}\r\n", chunk.len()).into_bytes();
            framed.extend_from_slice(chunk);
            framed.extend_from_slice(b"\r\n");
            stream.write_all(&framed)?;
        }
        stream.write_all(b"0\r\n\r\n")
    }
}

/// A request sent (or partly sent) whose response has not been read yet.
pub struct SentRequest {
    method: String,
    stream: DeadlineStream,
    write_result: io::Result<()>,
}

impl SentRequest {
    /// Reads the response head; the body is read from the result as it arrives.
    pub fn finish(self) -> io::Result<OpenResponse> {
        let mut reader = BufReader::new(self.stream);
        // A server may answer (e.g. 413) and close before reading the whole body; its answer is
        // what the test wants to see, so read it even when writing failed.
        let head = match read_head(&mut reader) {
            Ok(head) => head,
            Err(read_error) => return Err(self.write_result.err().unwrap_or(read_error)),
        };
        let framing = Framing::of(&self.method, head.status, &head.headers)?;
        Ok(OpenResponse {
            status: head.status,
            headers: head.headers,
            body: BodyReader { reader, framing },
        })
    }
}

/// Response headers, in arrival order; names compared case-insensitively.
#[derive(Debug, Clone, Default)]
pub struct Headers(pub Vec<(String, String)>);

impl Headers {
    /// The first value of header `name`.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(candidate, _)| candidate.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }
}

/// A complete response.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: Headers,
    pub body: Vec<u8>,
    /// From the start of the call to the last byte.
    pub elapsed: Duration,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name)
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON; panics, showing the response, if it is not.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|error| panic!("response is not JSON ({error}): {}", self.describe()))
    }

    /// Status, headers and (the start of) the body, for assertion messages.
    pub fn describe(&self) -> String {
        let mut text = format!("HTTP {}", self.status);
        for (name, value) in &self.headers.0 {
            text.push_str(&format!("\n  {name}: {value}"));
        }
        let body = self.text();
        let shown: String = body.chars().take(2000).collect();
        text.push_str(&format!("\n  body ({} bytes): {shown}", self.body.len()));
        text
    }
}

/// A response whose head has arrived; reading it yields the decoded body.
pub struct OpenResponse {
    pub status: u16,
    pub headers: Headers,
    body: BodyReader,
}

impl OpenResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name)
    }
}

impl Read for OpenResponse {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.body.read(buf)
    }
}

/// A TCP stream whose every read is bounded by one absolute deadline.
struct DeadlineStream {
    stream: TcpStream,
    deadline: Instant,
}

impl Read for DeadlineStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let remaining = self.deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "HTTP call deadline passed",
            ));
        }
        self.stream.set_read_timeout(Some(remaining))?;
        match self.stream.read(buf) {
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "HTTP call deadline passed",
            )),
            other => other,
        }
    }
}

struct Head {
    status: u16,
    headers: Headers,
}

fn read_head(reader: &mut BufReader<DeadlineStream>) -> io::Result<Head> {
    let mut head_bytes = 0;
    let mut line = String::new();
    loop {
        let status_line = read_line(reader, &mut line, &mut head_bytes)?;
        let status = parse_status_line(&status_line)?;
        let headers = read_headers(reader, &mut line, &mut head_bytes)?;
        // Interim 1xx responses precede the real one.
        if !(100..200).contains(&status) {
            return Ok(Head { status, headers });
        }
    }
}

fn read_headers(
    reader: &mut BufReader<DeadlineStream>,
    line: &mut String,
    head_bytes: &mut usize,
) -> io::Result<Headers> {
    let mut headers = Vec::new();
    loop {
        let header_line = read_line(reader, line, head_bytes)?;
        if header_line.is_empty() {
            return Ok(Headers(headers));
        }
        let (name, value) = header_line
            .split_once(':')
            .ok_or_else(|| invalid(format!("malformed header line {header_line:?}")))?;
        headers.push((name.trim().to_ascii_lowercase(), value.trim().to_string()));
    }
}

/// One CRLF- (or LF-) terminated line without its terminator; EOF before it is an error.
fn read_line(
    reader: &mut impl BufRead,
    line: &mut String,
    budget_used: &mut usize,
) -> io::Result<String> {
    line.clear();
    let read = reader.read_line(line)?;
    if read == 0 || !line.ends_with('\n') {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed mid-line",
        ));
    }
    *budget_used += read;
    if *budget_used > MAX_HEAD_BYTES {
        return Err(invalid("response head too large".to_string()));
    }
    Ok(line.trim_end_matches(['\r', '\n']).to_string())
}

fn parse_status_line(line: &str) -> io::Result<u16> {
    let mut parts = line.splitn(3, ' ');
    let version = parts.next().unwrap_or_default();
    let code = parts.next().unwrap_or_default();
    if !version.starts_with("HTTP/1.") {
        return Err(invalid(format!("not an HTTP/1 status line: {line:?}")));
    }
    code.parse()
        .map_err(|_| invalid(format!("bad status code in {line:?}")))
}

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

/// How the end of a response body is found (RFC 9112 §6.3).
#[derive(Debug)]
enum Framing {
    Fixed { remaining: u64 },
    Chunked(ChunkState),
    UntilClose,
}

#[derive(Debug, Clone, Copy)]
enum ChunkState {
    Size,
    Data { remaining: u64 },
    DataEnd,
    Done,
}

impl Framing {
    fn of(method: &str, status: u16, headers: &Headers) -> io::Result<Framing> {
        if method == "HEAD" || status == 204 || status == 304 {
            return Ok(Framing::Fixed { remaining: 0 });
        }
        if let Some(encoding) = headers.get("transfer-encoding")
            && encoding.to_ascii_lowercase().contains("chunked")
        {
            return Ok(Framing::Chunked(ChunkState::Size));
        }
        match headers.get("content-length") {
            Some(length) => {
                let remaining = length
                    .trim()
                    .parse()
                    .map_err(|_| invalid(format!("bad content-length {length:?}")))?;
                Ok(Framing::Fixed { remaining })
            }
            None => Ok(Framing::UntilClose),
        }
    }
}

struct BodyReader {
    reader: BufReader<DeadlineStream>,
    framing: Framing,
}

impl Read for BodyReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        match &mut self.framing {
            Framing::UntilClose => self.reader.read(buf),
            Framing::Fixed { remaining } => {
                if *remaining == 0 {
                    return Ok(0);
                }
                let wanted = buf
                    .len()
                    .min(usize::try_from(*remaining).unwrap_or(usize::MAX));
                let read = self.reader.read(&mut buf[..wanted])?;
                if read == 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "body cut short",
                    ));
                }
                *remaining -= read as u64;
                Ok(read)
            }
            Framing::Chunked(state) => read_chunked(&mut self.reader, state, buf),
        }
    }
}

fn read_chunked(
    reader: &mut BufReader<DeadlineStream>,
    state: &mut ChunkState,
    buf: &mut [u8],
) -> io::Result<usize> {
    let mut line = String::new();
    loop {
        match *state {
            ChunkState::Done => return Ok(0),
            ChunkState::Size => {
                let mut used = 0;
                let size_line = read_line(reader, &mut line, &mut used)?;
                let digits = size_line.split(';').next().unwrap_or_default().trim();
                let size = u64::from_str_radix(digits, 16)
                    .map_err(|_| invalid(format!("bad chunk size line {size_line:?}")))?;
                if size == 0 {
                    // Trailer section, up to the empty line.
                    while !read_line(reader, &mut line, &mut used)?.is_empty() {}
                    *state = ChunkState::Done;
                } else {
                    *state = ChunkState::Data { remaining: size };
                }
            }
            ChunkState::Data { remaining } => {
                let wanted = buf
                    .len()
                    .min(usize::try_from(remaining).unwrap_or(usize::MAX));
                let read = reader.read(&mut buf[..wanted])?;
                if read == 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "chunk cut short",
                    ));
                }
                let left = remaining - read as u64;
                *state = if left == 0 {
                    ChunkState::DataEnd
                } else {
                    ChunkState::Data { remaining: left }
                };
                return Ok(read);
            }
            ChunkState::DataEnd => {
                let mut used = 0;
                let end = read_line(reader, &mut line, &mut used)?;
                if !end.is_empty() {
                    return Err(invalid(format!("chunk not followed by CRLF: {end:?}")));
                }
                *state = ChunkState::Size;
            }
        }
    }
}
