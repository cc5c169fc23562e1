//! Codec tests.
