//! One module per subcommand.

pub(crate) mod doctor;
pub(crate) mod files;
pub(crate) mod logs;
pub(crate) mod metrics;
pub(crate) mod run;
pub(crate) mod runs;
pub(crate) mod server;
pub(crate) mod store;
pub(crate) mod sync;
