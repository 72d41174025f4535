//! The one place where Rust errors become Python exceptions. The exception
//! classes themselves are declared in `relaunch/errors.py`.

use pyo3::PyErr;
use relaunch_store::ErrorKind;

pyo3::import_exception!(relaunch.errors, StoreError);
pyo3::import_exception!(relaunch.errors, StoreTimeoutError);
pyo3::import_exception!(relaunch.errors, StoreConnectionError);
pyo3::import_exception!(relaunch.errors, StoreRequestError);
pyo3::import_exception!(relaunch.errors, QueueEmptyError);
pyo3::import_exception!(relaunch.errors, TrackingError);
pyo3::import_exception!(relaunch.errors, TrackingTimeoutError);
pyo3::import_exception!(relaunch.errors, TrackingConnectionError);
pyo3::import_exception!(relaunch.errors, TrackingRejectedError);
pyo3::import_exception!(relaunch.errors, TrackingConfigError);
pyo3::import_exception!(relaunch.errors, ProcessStartError);

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

pub(crate) fn tracking_error(e: relaunch_client::ClientError) -> PyErr {
    use relaunch_client::ErrorKind as K;
    let message = e.to_string();
    match e.kind() {
        K::Config => TrackingConfigError::new_err(message),
        K::Timeout => TrackingTimeoutError::new_err(message),
        K::Unavailable => TrackingConnectionError::new_err(message),
        K::Unauthorized | K::NotFound | K::Conflict | K::TooLarge | K::BadRequest => {
            TrackingRejectedError::new_err(message)
        }
        K::Corrupt | K::Io => TrackingError::new_err(message),
    }
}

pub(crate) fn launch_error(e: relaunch_launch::LaunchError) -> PyErr {
    ProcessStartError::new_err(e.to_string())
}
