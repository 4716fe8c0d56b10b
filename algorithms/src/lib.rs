//! flowrl-algorithms
