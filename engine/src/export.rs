//! Graph export (`flowrl graph FILE --format dot|mermaid|html|json`): node kinds, port types on the
//! edges, resources (dashed edges to the nodes that use them) and placement: each node's devices
//! in this process (`cpu:0, cpu:1 · data-parallel` for a data-parallel node on all run devices,
//! `cuda:1` for a node on one device).
//!
//! The HTML export is one self-contained file: an inline SVG drawn with a layered layout computed
//! here (layer = longest path from a source), plus tables of parameters. No script, no CDN.

use crate::device::device_list;
use crate::graph::{Graph, NodeId};
use crate::params::ParamType;
use serde_json::json;
use std::fmt::Write as _;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Dot,
    Mermaid,
    Html,
    Json,
}

/// Exports `graph` with the placement it was compiled for (`graph.devices`).
pub fn export(graph: &Graph, format: Format) -> String {
    match format {
        Format::Dot => to_dot(graph),
        Format::Mermaid => to_mermaid(graph),
        Format::Html => to_html(graph),
        Format::Json => serde_json::to_string_pretty(&to_json(graph)).expect("json") + "\n",
    }
}

/// Node `id`'s placement as shown: `cpu:0, cpu:1 · data-parallel` when it runs one replica on
/// every run device, else its one device.
pub fn placement_label(graph: &Graph, id: NodeId) -> String {
    let devices = device_list(&graph.node_devices(id));
    if graph.nodes[id].spans_run_devices() {
        format!("{devices} · data-parallel")
    } else {
        devices
    }
}

/// (param name, resource name) for every resource-typed parameter of node `id`.
pub fn node_resources(graph: &Graph, id: NodeId) -> Vec<(String, String)> {
    let n = &graph.nodes[id];
    n.kind
        .params()
        .iter()
        .filter(|p| matches!(p.ty, ParamType::Resource(_)))
        .filter_map(|p| Some((p.name.clone(), n.params.get_str(&p.name)?.to_string())))
        .collect()
}

fn dot_str(s: &str) -> String {
    let mut o = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            '\n' => o.push_str("\\n"),
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

pub fn to_dot(graph: &Graph) -> String {
    let mut s = String::new();
    s.push_str("digraph flowrl {\n  rankdir=LR;\n  node [shape=box, style=\"rounded,filled\", fillcolor=\"#eef3fb\", fontname=\"Helvetica\"];\n  edge [fontname=\"Helvetica\", fontsize=10];\n");
    for (i, n) in graph.nodes.iter().enumerate() {
        let label = format!(
            "{}\nkind: {}\ndevice: {}",
            n.name,
            n.kind.name(),
            placement_label(graph, i)
        );
        let _ = writeln!(
            s,
            "  {} [label={}];",
            dot_str(&format!("n:{}", n.name)),
            dot_str(&label)
        );
    }
    for r in &graph.resources {
        let label = format!("{}\n{} resource", r.name, r.kind.name());
        let _ = writeln!(
            s,
            "  {} [label={}, shape=cylinder, fillcolor=\"#fdf3e1\"];",
            dot_str(&format!("r:{}", r.name)),
            dot_str(&label)
        );
    }
    for n in &graph.nodes {
        for e in &n.inputs {
            let label = format!("{} → {}\n{}", e.from_port, e.port, e.ty);
            let _ = writeln!(
                s,
                "  {} -> {} [label={}];",
                dot_str(&format!("n:{}", graph.nodes[e.from].name)),
                dot_str(&format!("n:{}", n.name)),
                dot_str(&label)
            );
        }
    }
    for (i, n) in graph.nodes.iter().enumerate() {
        for (param, res) in node_resources(graph, i) {
            let _ = writeln!(
                s,
                "  {} -> {} [style=dashed, arrowhead=none, label={}];",
                dot_str(&format!("r:{res}")),
                dot_str(&format!("n:{}", n.name)),
                dot_str(&param)
            );
        }
    }
    for r in &graph.resources {
        for &d in &r.depends {
            let _ = writeln!(
                s,
                "  {} -> {} [style=dashed];",
                dot_str(&format!("r:{}", graph.resources[d].name)),
                dot_str(&format!("r:{}", r.name))
            );
        }
    }
    s.push_str("}\n");
    s
}

fn mermaid_id(prefix: &str, name: &str) -> String {
    let clean: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    format!("{prefix}_{clean}")
}

fn mermaid_text(s: &str) -> String {
    s.replace('"', "#quot;")
}

pub fn to_mermaid(graph: &Graph) -> String {
    let mut s = String::from("flowchart LR\n");
    for (i, n) in graph.nodes.iter().enumerate() {
        let _ = writeln!(
            s,
            "  {}[\"<b>{}</b><br/>{}<br/>{}\"]",
            mermaid_id("n", &n.name),
            mermaid_text(&n.name),
            mermaid_text(n.kind.name()),
            mermaid_text(&placement_label(graph, i))
        );
    }
    for r in &graph.resources {
        let _ = writeln!(
            s,
            "  {}[(\"{}<br/>{} resource\")]",
            mermaid_id("r", &r.name),
            mermaid_text(&r.name),
            mermaid_text(r.kind.name())
        );
    }
    for n in &graph.nodes {
        for e in &n.inputs {
            let _ = writeln!(
                s,
                "  {} -- \"{}: {} → {}\" --> {}",
                mermaid_id("n", &graph.nodes[e.from].name),
                e.ty,
                mermaid_text(&e.from_port),
                mermaid_text(&e.port),
                mermaid_id("n", &n.name)
            );
        }
    }
    for (i, n) in graph.nodes.iter().enumerate() {
        for (param, res) in node_resources(graph, i) {
            let _ = writeln!(
                s,
                "  {} -. \"{}\" .- {}",
                mermaid_id("r", &res),
                mermaid_text(&param),
                mermaid_id("n", &n.name)
            );
        }
    }
    for r in &graph.resources {
        for &d in &r.depends {
            let _ = writeln!(
                s,
                "  {} -.-> {}",
                mermaid_id("r", &graph.resources[d].name),
                mermaid_id("r", &r.name)
            );
        }
    }
    s
}

pub fn to_json(graph: &Graph) -> serde_json::Value {
    json!({
        "run": graph.run,
        "devices": graph.devices.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "world": graph.world,
        "resources": graph.resources.iter().map(|r| json!({
            "name": r.name,
            "kind": r.kind.name(),
            "params": r.params.as_map(),
            "device": r.device_in(&graph.devices).to_string(),
            "depends": r.depends.iter().map(|&d| graph.resources[d].name.clone()).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "nodes": graph.nodes.iter().enumerate().map(|(i, n)| json!({
            "name": n.name,
            "kind": n.kind.name(),
            "devices": graph.node_devices(i).iter().map(ToString::to_string).collect::<Vec<_>>(),
            "data_parallel": n.spans_run_devices(),
            "timing_key": n.timing_key,
            "params": n.params.as_map(),
            "resources": node_resources(graph, i).into_iter().map(|(p, r)| json!({"param": p, "resource": r})).collect::<Vec<_>>(),
            "inputs": n.inputs.iter().map(|e| json!({
                "port": e.port,
                "from": graph.nodes[e.from].name,
                "from_port": e.from_port,
                "type": e.ty.name(),
            })).collect::<Vec<_>>(),
            "outputs": n.kind.outputs().iter().map(|o| json!({"port": o.name, "type": o.ty.name()})).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "order": graph.order.iter().map(|&i| graph.nodes[i].name.clone()).collect::<Vec<_>>(),
    })
}

/// One box of the SVG, a `<g>` on one line: a `w`×`h` rect at (`x`, `y`) with the attributes
/// `rect`, then per `(dy, style, text)` a line of `text` (escaped here) at `dy` below its top,
/// centred.
fn svg_box(
    svg: &mut String,
    (x, y): (f64, f64),
    (w, h): (f64, f64),
    rect: &str,
    lines: &[(f64, &str, &str)],
) {
    let _ = write!(
        svg,
        "<g><rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"{w}\" height=\"{h}\" {rect}/>"
    );
    for (dy, style, text) in lines {
        let _ = write!(
            svg,
            "<text x=\"{:.1}\" y=\"{:.1}\" {style}>{}</text>",
            x + w / 2.0,
            y + dy,
            esc(text)
        );
    }
    svg.push_str("</g>\n");
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The parameters table cell of a node or resource: one `<code>name = value</code>` per line.
fn params_cell(params: &serde_json::Map<String, serde_json::Value>) -> String {
    params
        .iter()
        .map(|(k, v)| format!("<code>{}</code>", esc(&format!("{k} = {v}"))))
        .collect::<Vec<_>>()
        .join("<br>")
}

/// Layer of each node: the longest path from a node without inputs.
fn layers(graph: &Graph) -> Vec<usize> {
    let mut layer = vec![0usize; graph.nodes.len()];
    for &i in &graph.order {
        for e in &graph.nodes[i].inputs {
            layer[i] = layer[i].max(layer[e.from] + 1);
        }
    }
    layer
}

pub fn to_html(graph: &Graph) -> String {
    const W: f64 = 210.0;
    const H: f64 = 72.0;
    const GX: f64 = 110.0;
    const GY: f64 = 40.0;
    let layer = layers(graph);
    let nlayers = layer.iter().copied().max().map_or(0, |m| m + 1);
    // Edges that skip a layer run in their own lane above the boxes, so they never pass behind one.
    let long_edges = graph
        .nodes
        .iter()
        .enumerate()
        .flat_map(|(to, n)| n.inputs.iter().map(move |e| (e.from, to)))
        .filter(|&(from, to)| layer[to] > layer[from] + 1)
        .count();
    const LANE: f64 = 16.0;
    let top = 20.0 + long_edges as f64 * LANE;
    let mut rows = vec![0usize; nlayers.max(1)];
    let mut pos = vec![(0.0, 0.0); graph.nodes.len()];
    for &i in &graph.order {
        let l = layer[i];
        pos[i] = (20.0 + l as f64 * (W + GX), top + rows[l] as f64 * (H + GY));
        rows[l] += 1;
    }
    let max_rows = rows.iter().copied().max().unwrap_or(1);
    let res_y = top + max_rows as f64 * (H + GY) + 20.0;
    let res_pos: Vec<(f64, f64)> = (0..graph.resources.len())
        .map(|k| (20.0 + k as f64 * (W + 40.0), res_y))
        .collect();
    let width = (20.0 + nlayers.max(1) as f64 * (W + GX))
        .max(20.0 + graph.resources.len() as f64 * (W + 40.0))
        + 20.0;
    let height = if graph.resources.is_empty() {
        res_y
    } else {
        res_y + H + 30.0
    };

    let mut svg = String::new();
    let _ = write!(
        svg,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width:.0}\" height=\"{height:.0}\" viewBox=\"0 0 {width:.0} {height:.0}\" font-family=\"Helvetica, Arial, sans-serif\">\n<defs><marker id=\"arrow\" viewBox=\"0 0 10 10\" refX=\"10\" refY=\"5\" markerWidth=\"8\" markerHeight=\"8\" orient=\"auto-start-reverse\"><path d=\"M 0 0 L 10 5 L 0 10 z\" fill=\"#456\"/></marker></defs>\n"
    );
    let mut lane = 0usize;
    for (to, n) in graph.nodes.iter().enumerate() {
        for e in &n.inputs {
            let (x1, y1) = (pos[e.from].0 + W, pos[e.from].1 + H / 2.0);
            let (x2, y2) = (pos[to].0, pos[to].1 + H / 2.0);
            let (path, mx, label_y) = if layer[to] > layer[e.from] + 1 {
                // Leave the source's right side, climb in the gap after its column, travel in a
                // lane above every box, and come down in the gap before the target's column.
                let ly = 14.0 + lane as f64 * LANE;
                let gx = x1 + 14.0 + (lane % 6) as f64 * 6.0;
                lane += 1;
                let path = format!(
                    "M {x1:.1} {y1:.1} L {:.1} {y1:.1} Q {gx:.1} {y1:.1}, {gx:.1} {:.1} L {gx:.1} {:.1} Q {gx:.1} {ly:.1}, {:.1} {ly:.1} L {:.1} {ly:.1} C {:.1} {ly:.1}, {:.1} {y2:.1}, {x2:.1} {y2:.1}",
                    gx - 8.0,
                    y1 - 8.0,
                    ly + 8.0,
                    gx + 8.0,
                    x2 - GX / 2.0,
                    x2 - 20.0,
                    x2 - 20.0
                );
                let sx = gx;
                (path, (sx + x2) / 2.0, ly - 3.0)
            } else {
                let mx = (x1 + x2) / 2.0;
                let path = format!(
                    "M {x1:.1} {y1:.1} C {mx:.1} {y1:.1}, {mx:.1} {y2:.1}, {x2:.1} {y2:.1}"
                );
                (path, mx, (y1 + y2) / 2.0 - 4.0)
            };
            let _ = writeln!(
                svg,
                "<path d=\"{path}\" fill=\"none\" stroke=\"#456\" stroke-width=\"1.5\" marker-end=\"url(#arrow)\"><title>{} → {} ({})</title></path>",
                esc(&format!("{}.{}", graph.nodes[e.from].name, e.from_port)),
                esc(&format!("{}.{}", n.name, e.port)),
                esc(e.ty.name())
            );
            let _ = writeln!(
                svg,
                "<text x=\"{mx:.1}\" y=\"{label_y:.1}\" font-size=\"11\" text-anchor=\"middle\" fill=\"#234\">{}</text>",
                esc(e.ty.name())
            );
        }
        for (param, res) in node_resources(graph, to) {
            if let Some(k) = graph.resources.iter().position(|r| r.name == res) {
                let (x1, y1) = (res_pos[k].0 + W / 2.0, res_pos[k].1);
                let (x2, y2) = (pos[to].0 + W / 2.0, pos[to].1 + H);
                let _ = writeln!(
                    svg,
                    "<path d=\"M {x1:.1} {y1:.1} L {x2:.1} {y2:.1}\" stroke=\"#b07a1a\" stroke-dasharray=\"5,4\" fill=\"none\"><title>{} = {}</title></path>",
                    esc(&format!("{}.{param}", n.name)),
                    esc(&res)
                );
            }
        }
    }
    const BOLD: &str = "font-size=\"14\" font-weight=\"bold\" text-anchor=\"middle\"";
    const PLAIN: &str = "font-size=\"12\" text-anchor=\"middle\"";
    for (i, n) in graph.nodes.iter().enumerate() {
        svg_box(
            &mut svg,
            pos[i],
            (W, H),
            "rx=\"8\" fill=\"#eef3fb\" stroke=\"#456\"",
            &[
                (22.0, BOLD, &n.name),
                (42.0, PLAIN, n.kind.name()),
                (
                    60.0,
                    "font-size=\"11\" text-anchor=\"middle\" fill=\"#567\"",
                    &placement_label(graph, i),
                ),
            ],
        );
    }
    for (k, r) in graph.resources.iter().enumerate() {
        svg_box(
            &mut svg,
            res_pos[k],
            (W, H),
            "rx=\"20\" fill=\"#fdf3e1\" stroke=\"#b07a1a\"",
            &[
                (30.0, BOLD, &r.name),
                (50.0, PLAIN, &format!("{} resource", r.kind.name())),
            ],
        );
    }
    svg.push_str("</svg>\n");

    let mut html = String::new();
    // The page is titled with the graph file's name (the first source is the graph file).
    let title = graph
        .sources
        .sources
        .first()
        .and_then(|s| std::path::Path::new(&s.name).file_name())
        .map_or_else(
            || "flowrl graph".to_string(),
            |n| n.to_string_lossy().to_string(),
        );
    html.push_str("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n");
    let _ = writeln!(html, "<title>{}</title>", esc(&title));
    html.push_str("<style>\nbody{font-family:Helvetica,Arial,sans-serif;margin:24px;color:#123}\ntable{border-collapse:collapse;margin:8px 0 20px}\ntd,th{border:1px solid #ccd;padding:4px 8px;text-align:left;vertical-align:top;font-size:13px}\nth{background:#eef3fb}\ncode{font-size:12px}\n.graph{overflow:auto;border:1px solid #ccd;padding:8px}\n</style>\n</head>\n<body>\n");
    let _ = writeln!(
        html,
        "<h1>flowrl graph</h1>\n<p>{} nodes, {} resources; {} steps, seed {}, devices <code>{}</code>.</p>",
        graph.nodes.len(),
        graph.resources.len(),
        graph.run.steps,
        graph.run.seed,
        esc(&device_list(&graph.devices))
    );
    let _ = writeln!(html, "<div class=\"graph\">\n{svg}</div>");
    html.push_str("<h2>Nodes</h2>\n<table>\n<tr><th>node</th><th>kind</th><th>device</th><th>inputs</th><th>outputs</th><th>parameters</th></tr>\n");
    for &i in &graph.order {
        let n = &graph.nodes[i];
        let inputs: Vec<String> = n
            .inputs
            .iter()
            .map(|e| {
                esc(&format!(
                    "{} ← {}.{} ({})",
                    e.port, graph.nodes[e.from].name, e.from_port, e.ty
                ))
            })
            .collect();
        let outputs: Vec<String> = n
            .kind
            .outputs()
            .iter()
            .map(|o| esc(&format!("{} ({})", o.name, o.ty)))
            .collect();
        let _ = writeln!(
            html,
            "<tr><td><b>{}</b></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&n.name),
            esc(n.kind.name()),
            esc(&placement_label(graph, i)),
            inputs.join("<br>"),
            outputs.join("<br>"),
            params_cell(n.params.as_map())
        );
    }
    html.push_str("</table>\n");
    if !graph.resources.is_empty() {
        html.push_str("<h2>Resources</h2>\n<table>\n<tr><th>resource</th><th>kind</th><th>parameters</th></tr>\n");
        for r in &graph.resources {
            let _ = writeln!(
                html,
                "<tr><td><b>{}</b></td><td>{}</td><td>{}</td></tr>",
                esc(&r.name),
                esc(r.kind.name()),
                params_cell(r.params.as_map())
            );
        }
        html.push_str("</table>\n");
    }
    html.push_str("</body>\n</html>\n");
    html
}
