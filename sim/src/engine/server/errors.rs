//! OpenAI-style error responses, with vLLM's types and statuses.

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use serde::Serialize;

use super::body::{Body, full};

/// An error a client sees: `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status (also put in `code`, as vLLM does).
    pub status: StatusCode,
    /// Human-readable message.
    pub message: String,
    /// The offending parameter, when known.
    pub param: Option<String>,
    /// `type` when vLLM names it explicitly rather than by the status (the Responses API
    /// answers `invalid_request_error`); `None` derives it from the status.
    pub kind_override: Option<&'static str>,
}

impl ApiError {
    /// 400 Bad Request.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            param: None,
            kind_override: None,
        }
    }

    /// 400 Bad Request naming the offending parameter.
    pub fn bad_param(param: &str, message: impl Into<String>) -> Self {
        Self {
            param: Some(param.to_owned()),
            ..Self::bad_request(message)
        }
    }

    /// 404 Not Found.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            message: message.into(),
            param: None,
            kind_override: None,
        }
    }

    /// 405 Method Not Allowed.
    pub fn method_not_allowed() -> Self {
        Self {
            status: StatusCode::METHOD_NOT_ALLOWED,
            message: "Method Not Allowed".into(),
            param: None,
            kind_override: None,
        }
    }

    /// 413 Payload Too Large.
    pub fn too_large(limit: usize) -> Self {
        Self {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            message: format!("Request body exceeds the limit of {limit} bytes."),
            param: None,
            kind_override: None,
        }
    }

    /// 500 with vLLM's message for a request the engine failed (`GenerationError`): the body
    /// is `{"error":{"message":"Internal server error","type":"InternalServerError",...}}`.
    pub fn generation_failed() -> Self {
        Self {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: "Internal server error".into(),
            param: None,
            kind_override: None,
        }
    }

    /// 503 Service Unavailable (the engine loop is gone).
    pub fn unavailable() -> Self {
        Self {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: "The engine is shutting down.".into(),
            param: None,
            kind_override: None,
        }
    }

    /// The same error with vLLM's explicit `type` (`create_error_response(err_type=...)`).
    pub fn with_kind(self, kind: &'static str) -> Self {
        Self {
            kind_override: Some(kind),
            ..self
        }
    }

    /// 500 for a request the engine dropped without finishing it.
    pub fn dropped() -> Self {
        Self {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: "the engine dropped the request".into(),
            param: None,
            kind_override: None,
        }
    }

    /// vLLM's error type name: the explicit one, else the status's.
    pub fn kind(&self) -> &'static str {
        if let Some(kind) = self.kind_override {
            return kind;
        }
        match self.status {
            StatusCode::BAD_REQUEST => "BadRequestError",
            StatusCode::NOT_FOUND => "NotFoundError",
            StatusCode::METHOD_NOT_ALLOWED => "MethodNotAllowed",
            StatusCode::PAYLOAD_TOO_LARGE => "RequestEntityTooLarge",
            StatusCode::SERVICE_UNAVAILABLE => "ServiceUnavailableError",
            _ => "InternalServerError",
        }
    }

    /// The JSON body.
    pub fn body_bytes(&self) -> Bytes {
        #[derive(Serialize)]
        struct Inner<'a> {
            message: &'a str,
            #[serde(rename = "type")]
            kind: &'a str,
            param: Option<&'a str>,
            code: u16,
        }
        #[derive(Serialize)]
        struct Outer<'a> {
            error: Inner<'a>,
        }
        let body = Outer {
            error: Inner {
                message: &self.message,
                kind: self.kind(),
                param: self.param.as_deref(),
                code: self.status.as_u16(),
            },
        };
        Bytes::from(serde_json::to_vec(&body).expect("plain struct serializes"))
    }

    /// The HTTP response.
    pub fn into_response(self) -> Response<Body> {
        let mut resp = Response::new(full(self.body_bytes()));
        *resp.status_mut() = self.status;
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        resp
    }
}

impl From<serde_json::Error> for ApiError {
    fn from(e: serde_json::Error) -> Self {
        let message = match e.classify() {
            serde_json::error::Category::Syntax | serde_json::error::Category::Eof => {
                format!("Invalid JSON in request body: {e}")
            }
            _ => format!("Invalid request: {e}"),
        };
        Self::bad_request(message)
    }
}
