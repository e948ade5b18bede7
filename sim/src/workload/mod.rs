//! Workloads: what request `i` of a run asks for, defined once at the token level.
//!
//! A workload turns its parameters (a clap argument struct, shared by `kvmesh-sim load` and
//! `kvmesh-sim simulate`) and the run's seed into [`Request`]s: the prompt as [`Segment`]s,
//! the output length and the session. The load generator renders a request as text and a
//! JSON body (`crate::load::render`); the simulator hashes its tokens
//! (`crate::simulate::prompt`). Both therefore run the same requests for the same seed and
//! arguments, token for token, and a simulated result can be checked against a measured one.
//! Every request is a pure function of its index (no state, no answers fed back), so either
//! side can build request `i` whenever it sends it.

pub mod arrivals;
pub mod chat;
pub mod gsp;
pub mod hot;
pub mod image;
pub mod png;
pub mod rag;
pub mod segment;
pub mod trace;
pub mod vision;
pub mod zipf;

use std::sync::Arc;

pub use segment::Segment;

use kvmesh_protocol::mix64;

/// Request `index` of a workload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The prompt.
    pub segments: Vec<Segment>,
    /// How the segments are sent.
    pub form: Form,
    /// Tokens to generate (at least one).
    pub output_tokens: u32,
    /// The conversation it belongs to (see [`session_id`]).
    pub session: Option<u64>,
    /// Pictures in the prompt ([`Form::Chat`] only), at most one per message.
    pub attachments: Vec<Attachment>,
}

impl Request {
    /// Prompt tokens: the segments', the captions' and the pictures' (the chat template adds a
    /// few per message, see [`Form`]).
    pub fn prompt_tokens(&self) -> u64 {
        prompt_tokens(&self.segments, &self.attachments)
    }

    /// The attachment in message `message` (the segment of that index), if any.
    pub fn attachment(&self, message: usize) -> Option<&Attachment> {
        self.attachments.iter().find(|a| a.message == message)
    }

    /// The prompt's token ids at the simulator's level: each segment's
    /// ([`segment::tokens`]), a message with an attachment starting with its caption's and its
    /// picture's ([`image::Image::token_ids`]).
    pub fn tokens(&self) -> Vec<u32> {
        tokens(&self.segments, &self.attachments)
    }
}

/// The prompt tokens of `segments` with `attachments` (see [`Request::prompt_tokens`]).
pub fn prompt_tokens(segments: &[Segment], attachments: &[Attachment]) -> u64 {
    let text: u64 = segments.iter().map(|s| u64::from(s.tokens)).sum();
    let attached: u64 = attachments
        .iter()
        .map(|a| u64::from(a.caption.tokens) + u64::from(a.image.tokens))
        .sum();
    text + attached
}

/// The token ids of a prompt of `segments` with `attachments` (see [`Request::tokens`]).
pub fn tokens(segments: &[Segment], attachments: &[Attachment]) -> Vec<u32> {
    if attachments.is_empty() {
        return segment::tokens(segments);
    }
    let mut out = Vec::new();
    for (i, s) in segments.iter().enumerate() {
        if let Some(a) = attachments.iter().find(|a| a.message == i) {
            out.extend(segment::tokens(&[a.caption]));
            out.extend(a.image.token_ids());
        }
        out.extend(segment::tokens(&[*s]));
    }
    out
}

/// A picture inside a chat message: message `message` (segment `message`'s) sends the parts
/// `[text: caption][picture][text: the segment]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attachment {
    /// The message (its segment's index).
    pub message: usize,
    /// The text ahead of the picture.
    pub caption: Segment,
    pub image: Arc<image::Image>,
}

/// How a request's segments are sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    /// One prompt: the segments' text, concatenated.
    Prompt,
    /// A conversation, one message per segment: the system prompt, then user and assistant
    /// messages in turn, ending with a user message. The engine renders them with its chat
    /// template, which adds a few tokens around each message that the simulator leaves out.
    /// A message with an [`Attachment`] also holds a caption and a picture.
    Chat,
}

/// The `x-session-id` (and OpenAI `user`) value of session `session`.
pub fn session_id(session: u64) -> String {
    format!("session-{session}")
}

/// A source of requests.
pub trait Workload: Send + Sync {
    /// Requests in one pass over the workload, if it has a natural size.
    fn natural_size(&self) -> Option<u64>;
    /// Request `index`.
    fn request(&self, index: u64) -> Request;
    /// When request `index` arrives on the workload's own timeline (traces), in seconds after
    /// the first request.
    fn arrival_s(&self, _index: u64) -> Option<f64> {
        None
    }
}

/// Which workload to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum WorkloadKind {
    /// Generated shared prefix (SGLang's benchmark).
    Gsp,
    /// Multi-turn chat sessions.
    Chat,
    /// Retrieval-augmented prompts over a Zipf-popular corpus.
    Rag,
    /// RAG under cache pressure: a fixed preset (the --rag-* flags do not apply) for engines
    /// whose KV cache holds only a few of its contexts (see `workload::rag::PRESSURE`).
    RagPressure,
    /// One system prompt in a share of the traffic (a hot prefix), the rest distinct.
    Hot,
    /// Trace replay (Mooncake JSONL or Azure CSV).
    Trace,
    /// Multi-turn sessions about Zipf-popular pictures (real PNGs, sent as data URLs).
    Vision,
}

impl WorkloadKind {
    /// The name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            WorkloadKind::Gsp => "gsp",
            WorkloadKind::Chat => "chat",
            WorkloadKind::Rag => "rag",
            WorkloadKind::RagPressure => "rag-pressure",
            WorkloadKind::Hot => "hot",
            WorkloadKind::Trace => "trace",
            WorkloadKind::Vision => "vision",
        }
    }

    /// KV blocks per engine the workload is made for, if it is made for one.
    pub fn kv_blocks(self) -> Option<u32> {
        match self {
            WorkloadKind::RagPressure => Some(rag::PRESSURE_KV_BLOCKS),
            _ => None,
        }
    }
}

/// The parameters of every workload.
#[derive(Debug, Clone, clap::Args, serde::Serialize)]
pub struct WorkloadArgs {
    #[command(flatten)]
    pub gsp: gsp::GspArgs,
    #[command(flatten)]
    pub chat: chat::ChatArgs,
    #[command(flatten)]
    pub rag: rag::RagArgs,
    #[command(flatten)]
    pub hot: hot::HotArgs,
    #[command(flatten)]
    pub trace: trace::TraceArgs,
    #[command(flatten)]
    pub vision: vision::VisionArgs,
}

impl WorkloadArgs {
    /// The workload to run when `--workload` says `kind`: a `--trace FILE` makes it a trace.
    pub fn kind(&self, kind: WorkloadKind) -> WorkloadKind {
        match self.trace.trace {
            Some(_) => WorkloadKind::Trace,
            None => kind,
        }
    }

    /// The workload `kind` with these parameters under `seed` (loads the trace file for
    /// [`WorkloadKind::Trace`]).
    pub fn build(
        &self,
        kind: WorkloadKind,
        seed: u64,
    ) -> Result<Arc<dyn Workload>, trace::TraceError> {
        Ok(match kind {
            WorkloadKind::Gsp => Arc::new(gsp::Gsp::new(self.gsp.clone(), seed)),
            WorkloadKind::Chat => Arc::new(chat::Chat::new(self.chat.clone(), seed)),
            WorkloadKind::Rag => Arc::new(rag::Rag::new(self.rag.clone(), seed)),
            WorkloadKind::RagPressure => Arc::new(rag::Rag::new(rag::PRESSURE, seed)),
            WorkloadKind::Hot => Arc::new(hot::Hot::new(self.hot.clone(), seed)),
            WorkloadKind::Vision => Arc::new(vision::Vision::new(self.vision.clone(), seed)),
            WorkloadKind::Trace => {
                let entries = trace::load(&self.trace.path())?;
                Arc::new(trace::Trace::new(entries, self.trace.clone(), seed))
            }
        })
    }
}

/// The target request `index` goes to when targets are picked at random (the load generator's
/// `--pick random`, the simulator's entry nodes): a pure function of the seed and the index,
/// so that both send request `i` through the same node.
pub fn random_target(seed: u64, index: u64, targets: usize) -> usize {
    (mix64(seed ^ mix64(index)) % targets.max(1) as u64) as usize
}

/// A text key from the run seed and a few labels.
pub fn key(seed: u64, parts: &[u64]) -> u64 {
    parts
        .iter()
        .fold(mix64(seed ^ 0x6b76_6d65_7368), |h, &p| mix64(h ^ p))
}

/// A seeded Fisher-Yates permutation of `0..n`.
pub fn permutation(n: usize, seed: u64) -> Vec<u32> {
    let mut v: Vec<u32> = (0..n as u32).collect();
    let mut rng = crate::rng::SplitMix64::new(seed);
    for i in (1..v.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        v.swap(i, j);
    }
    v
}
