//! Stage 7, constraints: every resource and node kind's `validate` hook, on a graph whose earlier
//! stages passed. A hook may read the whole graph and the node's placement (to require work that
//! splits evenly over its replicas, say); the engine does not know what the kinds check.

use crate::diagnostic::Diagnostic;
use crate::graph::Graph;
use crate::node::{Subject, ValidateCtx};

/// The constraint stage. [`crate::Session::build`] runs it again when it places the graph on
/// other devices or processes than it was compiled for, since constraints may depend on the
/// replicas.
pub fn check_constraints(graph: &Graph) -> Vec<Diagnostic> {
    let mut diags = Vec::new();
    for i in 0..graph.resources.len() {
        let ctx = ValidateCtx {
            graph,
            subject: Subject::Resource(i),
        };
        diags.extend(graph.resources[i].kind.validate(&ctx));
    }
    for i in 0..graph.nodes.len() {
        let ctx = ValidateCtx {
            graph,
            subject: Subject::Node(i),
        };
        diags.extend(graph.nodes[i].kind.validate(&ctx));
    }
    diags
}
