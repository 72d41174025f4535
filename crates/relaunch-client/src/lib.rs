//! The tracking client: records go to a crash-safe local spool first
//! ([`spool`]), a background thread ships them to the server, and the server
//! stores each exactly once.

pub mod spool;
