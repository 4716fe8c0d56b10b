//! `flowrl-custom`: the engine's CLI (`run`, `validate`, `graph`, `nodes`, `plot`) with flowrl's
//! built-in kinds, this crate's kinds and flowrl's allocator. Try `cargo run --release -p
//! flowrl-example-custom-node -- run examples/custom_node/graph.toml`.

flowrl_nodes::plugin_main!(flowrl_example_custom_node::add_kinds);
