//! `flowrl-custom`: the engine's CLI (`run`, `validate`, `graph`, `nodes`, `plot`) with this
//! crate's node kinds added. Try `cargo run --release -p flowrl-example-custom-node -- run
//! examples/custom_node/graph.toml`.

fn main() -> std::process::ExitCode {
    flowrl_engine::cli::main_with(flowrl_example_custom_node::registry())
}
