//! The one place where Rust errors become Python exceptions. The exception
//! classes themselves are declared in `relaunch/errors.py`.

use pyo3::PyErr;
use relaunch_store::ErrorKind;

pyo3::import_exception!(relaunch.errors, StoreError);
pyo3::import_exception!(relaunch.errors, StoreTimeoutError);
pyo3::import_exception!(relaunch.errors, StoreConnectionError);
pyo3::import_exception!(relaunch.errors, StoreRequestError);
pyo3::import_exception!(relaunch.errors, QueueEmptyError);

pub(crate) fn store_error(e: relaunch_store::StoreError) -> PyErr {
    let message = e.to_string();
    match e.kind() {
        ErrorKind::Timeout => StoreTimeoutError::new_err(message),
        ErrorKind::Connection => StoreConnectionError::new_err(message),
        ErrorKind::InvalidInput => StoreRequestError::new_err(message),
        ErrorKind::NotFound => QueueEmptyError::new_err(message),
        ErrorKind::Protocol => StoreError::new_err(message),
    }
}
