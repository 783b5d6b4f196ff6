//! TEMPORARY stand-in until the real JCS module lands.
#![allow(missing_docs)]
#[derive(Debug)]
pub struct JcsError;
pub struct JsonPointer;
