//! The one error type of the handlers, and how it becomes a response: a
//! status and a JSON body that says what was wrong and what to do.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use relaunch_api::ApiError;

use crate::storage::StorageError;

#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    Unauthorized(String),
    /// A request of another site's page (`origin.rs`).
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    TooLarge(String),
    #[error("{0}")]
    UnsupportedMediaType(String),
    #[error("{0}")]
    RangeNotSatisfiable(String),
    #[error("{0}")]
    Internal(String),
    /// A storage service is away; the client retries later.
    #[error("{0}")]
    Unavailable(String),
    /// The server holds what it can of this kind of work now; the client
    /// retries shortly (a 503 with `Retry-After`).
    #[error("{0}")]
    Busy(String),
}

impl AppError {
    fn status_and_kind(&self) -> (StatusCode, &'static str) {
        match self {
            Self::BadRequest(_) => (StatusCode::BAD_REQUEST, "bad_request"),
            Self::Unauthorized(_) => (StatusCode::UNAUTHORIZED, "unauthorized"),
            Self::Forbidden(_) => (StatusCode::FORBIDDEN, "forbidden"),
            Self::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            Self::Conflict(_) => (StatusCode::CONFLICT, "conflict"),
            Self::TooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, "too_large"),
            Self::UnsupportedMediaType(_) => {
                (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type")
            }
            Self::RangeNotSatisfiable(_) => (StatusCode::RANGE_NOT_SATISFIABLE, "bad_range"),
            Self::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
            Self::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            Self::Busy(_) => (StatusCode::SERVICE_UNAVAILABLE, "busy"),
        }
    }
}

impl From<std::io::Error> for AppError {
    fn from(e: std::io::Error) -> Self {
        Self::Internal(format!("cannot read the upload's scratch file: {e}"))
    }
}

impl From<StorageError> for AppError {
    fn from(e: StorageError) -> Self {
        match e {
            StorageError::NotFound(m) => Self::NotFound(m),
            StorageError::Conflict(m) => Self::Conflict(m),
            StorageError::Invalid(m) => Self::BadRequest(m),
            StorageError::Unavailable(m) => Self::Unavailable(m),
            other => Self::Internal(other.to_string()),
        }
    }
}

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        let (status, kind) = self.status_and_kind();
        if status.is_server_error() && !matches!(self, Self::Busy(_)) {
            tracing::error!(error = %self, "request failed");
        }
        let busy = matches!(self, Self::Busy(_));
        let body = ApiError {
            error: self.to_string(),
            kind: kind.to_owned(),
        };
        let mut response = (status, Json(body)).into_response();
        if busy {
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from_static("1"),
            );
        }
        response
    }
}
