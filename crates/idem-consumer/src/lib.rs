//! `idem consume` as a library: reads a broker subscription
//! ([`idem_broker::Subscription`]), delivers each message to an HTTP
//! endpoint of the user's service through idem's contract (one claim per
//! delivery, the key derived from the message's intent), and settles the
//! message on the broker from the record: acknowledged only once the
//! record is final.

pub mod broker;
pub mod config;
pub mod contracts;
pub mod deliver;
pub mod handle;
pub mod pump;
pub mod run;
