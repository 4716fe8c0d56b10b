//! `orchestrator --port P`: burn-collective's global orchestrator, which the processes of a
//! multi-process run register with; it returns on Ctrl-C or SIGTERM. The engine parses the
//! command ([`flowrl_engine::cli::OrchestratorArgs`]) and hands it here, since the engine does
//! not link burn-collective; `flowrl` and every plugin binary ([`crate::main_with_builtin_and`])
//! pass [`run`] to [`flowrl_engine::cli::execute_with`].

use flowrl_engine::cli::OrchestratorArgs;
use std::process::ExitCode;

/// Listens on `--port` until the process is stopped (see [`flowrl_engine::cli::execute_with`]).
pub fn run(a: &OrchestratorArgs) -> anyhow::Result<ExitCode> {
    // The orchestrator only logs a failure to listen; a port in use must be a clear error.
    std::net::TcpListener::bind(("0.0.0.0", a.port))
        .map_err(|e| anyhow::anyhow!("the orchestrator cannot listen on port {}: {e}", a.port))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    println!("orchestrator listening on ws://0.0.0.0:{}", a.port);
    runtime.block_on(burn_collective::start_global_orchestrator(a.port));
    Ok(ExitCode::SUCCESS)
}
