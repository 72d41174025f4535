//! One module per subcommand.

pub(crate) mod doctor;
pub(crate) mod run;
pub(crate) mod server;
pub(crate) mod store;
