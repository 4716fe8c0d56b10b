//! flowrl-engine
