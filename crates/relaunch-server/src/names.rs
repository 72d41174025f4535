//! Names that come from requests, checked before anything uses them, with
//! the rules of `relaunch_api::names` (shared with the client).

use crate::error::AppError;

pub fn check_name(what: &str, name: &str) -> Result<(), AppError> {
    relaunch_api::names::check_name(what, name).map_err(AppError::BadRequest)
}

pub fn check_key(key: &str) -> Result<(), AppError> {
    relaunch_api::names::check_key(key).map_err(AppError::BadRequest)
}
