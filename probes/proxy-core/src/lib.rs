//! The framing parser as a library: the proxy binary uses it, and tests and
//! fuzzing drive it directly without a socket.

pub mod framing;
