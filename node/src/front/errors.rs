//! Errors a client sees, in the OpenAI shape vLLM uses:
//! `{"error": {"message", "type", "param", "code"}}` with the HTTP status in `code`.

use super::body::{ResponseBody, full};
use http::{HeaderValue, Response, StatusCode};

#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub param: Option<&'static str>,
    pub retry_after_secs: Option<u32>,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            param: None,
            retry_after_secs: None,
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    pub fn with_param(mut self, param: &'static str) -> Self {
        self.param = Some(param);
        self
    }

    pub fn unavailable(message: impl Into<String>, retry_after_secs: u32) -> Self {
        Self {
            retry_after_secs: Some(retry_after_secs),
            ..Self::new(StatusCode::SERVICE_UNAVAILABLE, message)
        }
    }

    /// The `type` vLLM and OpenAI clients expect for a status.
    fn error_type(&self) -> &'static str {
        match self.status {
            StatusCode::BAD_REQUEST => "BadRequestError",
            StatusCode::UNAUTHORIZED => "AuthenticationError",
            StatusCode::NOT_FOUND => "NotFoundError",
            StatusCode::METHOD_NOT_ALLOWED => "MethodNotAllowedError",
            StatusCode::PAYLOAD_TOO_LARGE => "RequestTooLargeError",
            StatusCode::SERVICE_UNAVAILABLE => "ServiceUnavailableError",
            StatusCode::GATEWAY_TIMEOUT | StatusCode::REQUEST_TIMEOUT => "TimeoutError",
            status if status.is_server_error() => "InternalServerError",
            _ => "BadRequestError",
        }
    }

    /// The JSON body, also used as an SSE error event.
    pub fn body_json(&self) -> serde_json::Value {
        serde_json::json!({"error": {
            "message": self.message,
            "type": self.error_type(),
            "param": self.param,
            "code": self.status.as_u16(),
        }})
    }

    pub fn into_response(self) -> Response<ResponseBody> {
        let mut response = Response::new(full(self.body_json().to_string()));
        *response.status_mut() = self.status;
        let headers = response.headers_mut();
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if let Some(secs) = self.retry_after_secs {
            headers.insert(http::header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if self.status == StatusCode::UNAUTHORIZED {
            headers.insert(
                http::header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer"),
            );
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openai_shape_with_status_in_code() {
        let error = ApiError::bad_request("bad").with_param("messages");
        let body = error.body_json();
        assert_eq!(body["error"]["type"], "BadRequestError");
        assert_eq!(body["error"]["code"], 400);
        assert_eq!(body["error"]["param"], "messages");
        let response = ApiError::unavailable("later", 1).into_response();
        assert_eq!(response.status(), 503);
        assert_eq!(response.headers()[http::header::RETRY_AFTER], "1");
    }
}
