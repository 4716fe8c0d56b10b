//! flowrl-datasets
