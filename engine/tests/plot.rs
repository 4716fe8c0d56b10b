//! `flowrl plot`: which panels and lines the SVG holds for small metrics files (flowrl's and
//! verl's), markers, non-finite values, overlays, smoothing; and the graph page's HTML title.

mod testkit;

use clap::Parser;
use flowrl_engine::cli::{Command, execute};
use flowrl_engine::export::{Format, export};
use flowrl_engine::plot::{PlotOptions, Role, RunMetrics, choose_panels, plot_run, plot_runs};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};

/// The colour of non-finite markers and notes, as the SVG writes it.
const NON_FINITE: &str = "#D62728";

/// Writes `rows` (JSON objects) as JSON lines to `path`, creating its directory.
fn write_rows(path: &Path, rows: &[Value]) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let text: String = rows.iter().map(|r| format!("{r}\n")).collect();
    std::fs::write(path, text).unwrap();
}

/// A run directory `dir/name` with `steps` training steps (score, accuracy, pg_loss), validation
/// at steps 0, 5, 10… over the data sources `sources` (under flowrl's names and verl's), and a
/// run.json naming `graphs/g.toml`.
fn run_dir(dir: &Path, name: &str, steps: u64, sources: &[&str]) -> PathBuf {
    let run = dir.join(name);
    let rows: Vec<Value> = (0..=steps)
        .map(|s| {
            let x = s as f64;
            let mut row = json!({"step": s});
            if s > 0 {
                row["critic/score/mean"] = json!(0.3 + 0.01 * x + 0.05 * (x * 1.7).sin());
                row["critic/score/acc/mean"] = json!(0.2 + 0.01 * x + 0.05 * (x * 2.3).cos());
                row["actor/pg_loss"] = json!(0.02 * (x * 0.9).sin());
            }
            if s % 5 == 0 {
                row["val/accuracy"] = json!(0.25 + 0.01 * x);
                row["val/score"] = json!(0.35 + 0.01 * x);
                for (k, source) in sources.iter().enumerate() {
                    let offset = 0.05 * k as f64;
                    row[format!("val/{source}/accuracy")] = json!(0.25 + offset + 0.01 * x);
                    row[format!("val/{source}/score")] = json!(0.35 + offset + 0.01 * x);
                    // The same series under verl's names, as the eval node also reports them.
                    row[format!("val-core/{source}/acc/mean@1")] = json!(0.25 + offset + 0.01 * x);
                    row[format!("val-aux/{source}/reward/mean@1")] =
                        json!(0.35 + offset + 0.01 * x);
                    row[format!("val-aux/{source}/format/mean@1")] = json!(1.0);
                }
            }
            row
        })
        .collect();
    write_rows(&run.join("metrics.jsonl"), &rows);
    std::fs::write(
        run.join("run.json"),
        json!({"graph_file": "graphs/g.toml", "steps": steps}).to_string(),
    )
    .unwrap();
    run
}

fn svg_of(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap()
}

/// The text elements of an SVG, unescaped enough for these tests.
fn text_elements(svg: &str) -> Vec<String> {
    svg.split("<text")
        .skip(1)
        .filter_map(|t| {
            let start = t.find('>')? + 1;
            let end = t.find("</text>")?;
            Some(t[start..end].trim().replace("&amp;", "&"))
        })
        .collect()
}

fn circles(svg: &str) -> usize {
    svg.matches("<circle").count()
}

#[test]
fn one_data_source_draws_no_duplicate_panel() {
    let tmp = tempfile::tempdir().unwrap();
    let run = run_dir(tmp.path(), "single", 10, &["flowrl/shapes"]);
    let panels = choose_panels(&[RunMetrics::read(&run).unwrap()]);
    let titles: Vec<&str> = panels.iter().map(|p| p.title.as_str()).collect();
    assert_eq!(titles, ["accuracy", "score", "actor/pg_loss"]);
    assert!(
        panels
            .iter()
            .flat_map(|p| &p.lines)
            .all(|l| !matches!(l.role, Role::ValSource(_))),
        "{panels:?}"
    );
    let svg = svg_of(&plot_run(&run, None).unwrap());
    assert!(!svg.contains("flowrl/shapes"), "the one source is drawn");
    assert!(
        !svg.contains("val-core"),
        "verl's name of the one source is drawn"
    );
}

#[test]
fn two_data_sources_draw_a_line_each() {
    let tmp = tempfile::tempdir().unwrap();
    let run = run_dir(tmp.path(), "two", 10, &["gsm8k", "math"]);
    let panels = choose_panels(&[RunMetrics::read(&run).unwrap()]);
    let accuracy = panels.iter().find(|p| p.title == "accuracy").unwrap();
    let keys: Vec<&str> = accuracy.lines.iter().map(|l| l.key.as_str()).collect();
    assert_eq!(
        keys,
        [
            "critic/score/acc/mean",
            "val/accuracy",
            "val/gsm8k/accuracy",
            "val/math/accuracy"
        ]
    );
    assert_eq!(
        panels.len(),
        3,
        "no panel of its own for a source: {panels:?}"
    );
    let svg = svg_of(&plot_run(&run, None).unwrap());
    let texts = text_elements(&svg);
    for label in ["val gsm8k", "val math"] {
        assert_eq!(
            texts.iter().filter(|t| *t == label).count(),
            2,
            "{label} in the accuracy and score legends: {texts:?}"
        );
    }
}

#[test]
fn the_accuracy_and_score_panels_hold_train_and_val() {
    let tmp = tempfile::tempdir().unwrap();
    let run = run_dir(tmp.path(), "r", 10, &[]);
    let panels = choose_panels(&[RunMetrics::read(&run).unwrap()]);
    let lines = |title: &str| -> Vec<(String, Role)> {
        let panel = panels.iter().find(|p| p.title == title).unwrap();
        panel
            .lines
            .iter()
            .map(|l| (l.key.clone(), l.role.clone()))
            .collect()
    };
    assert_eq!(
        lines("accuracy"),
        [
            ("critic/score/acc/mean".to_string(), Role::Train),
            ("val/accuracy".to_string(), Role::Val)
        ]
    );
    assert_eq!(
        lines("score"),
        [
            ("critic/score/mean".to_string(), Role::Train),
            ("val/score".to_string(), Role::Val)
        ]
    );
    let svg = svg_of(&plot_run(&run, None).unwrap());
    let texts = text_elements(&svg);
    assert!(texts.contains(&"accuracy: critic/score/acc/mean · val/accuracy".to_string()));
    assert!(texts.contains(&"score: critic/score/mean · val/score".to_string()));
    assert_eq!(
        texts.iter().filter(|t| *t == "train").count(),
        2,
        "{texts:?}"
    );
    assert_eq!(texts.iter().filter(|t| *t == "val").count(), 2, "{texts:?}");
    assert!(
        !texts
            .iter()
            .any(|t| t == "val/accuracy" || t == "val/score"),
        "validation has no panel of its own: {texts:?}"
    );
}

#[test]
fn sparse_series_are_drawn_with_markers() {
    let tmp = tempfile::tempdir().unwrap();
    let dense: Vec<Value> = (1..=10)
        .map(|s| json!({"step": s, "actor/pg_loss": 0.01 * s as f64}))
        .collect();
    let dense_file = tmp.path().join("dense/metrics.jsonl");
    write_rows(&dense_file, &dense);
    assert_eq!(
        circles(&svg_of(
            &plot_run(dense_file.parent().unwrap(), None).unwrap()
        )),
        0
    );

    // Validation at 3 of 10 steps, and a training metric at 2 of 10.
    let mut rows = dense.clone();
    for (i, s) in [0usize, 4, 9].into_iter().enumerate() {
        rows[s]["val/accuracy"] = json!(0.1 * i as f64);
    }
    rows[2]["actor/grad_norm"] = json!(1.0);
    rows[7]["actor/grad_norm"] = json!(2.0);
    let sparse_file = tmp.path().join("sparse/metrics.jsonl");
    write_rows(&sparse_file, &rows);
    let run = RunMetrics::read(sparse_file.parent().unwrap()).unwrap();
    assert!(run.is_sparse("val/accuracy") && run.is_sparse("actor/grad_norm"));
    assert!(!run.is_sparse("actor/pg_loss"));
    let svg = svg_of(&plot_run(sparse_file.parent().unwrap(), None).unwrap());
    // One marker per value, plus the swatch in the accuracy panel's legend ("val").
    assert_eq!(circles(&svg), 3 + 2 + 1, "{svg}");
}

#[test]
fn non_finite_values_are_flagged_on_their_panel() {
    let tmp = tempfile::tempdir().unwrap();
    let rows: Vec<Value> = (1..=8)
        .map(|s| {
            let loss = if s == 3 || s == 6 {
                Value::Null
            } else {
                json!(0.01 * s as f64)
            };
            json!({"step": s, "actor/pg_loss": loss, "actor/entropy": 1.0 / s as f64})
        })
        .collect();
    let file = tmp.path().join("nan/metrics.jsonl");
    write_rows(&file, &rows);
    let run = RunMetrics::read(file.parent().unwrap()).unwrap();
    assert_eq!(run.series["actor/pg_loss"].len(), 8, "nulls are kept");
    assert_eq!(run.series["actor/pg_loss"][2], (3, None));
    let svg = svg_of(&plot_run(file.parent().unwrap(), None).unwrap());
    let texts = text_elements(&svg);
    assert_eq!(
        texts
            .iter()
            .filter(|t| t.starts_with("non-finite"))
            .collect::<Vec<_>>(),
        ["non-finite at steps 3, 6"],
        "only the pg_loss panel: {texts:?}"
    );
    // Two crosses of two strokes each, and the note.
    assert_eq!(
        svg.matches(&format!("stroke=\"{NON_FINITE}\"")).count(),
        4,
        "{svg}"
    );
    assert_eq!(svg.matches(&format!("fill=\"{NON_FINITE}\"")).count(), 1);
}

#[test]
fn several_runs_overlay_with_their_names_in_the_legend() {
    let tmp = tempfile::tempdir().unwrap();
    let alpha = run_dir(tmp.path(), "alpha", 10, &[]);
    let beta = run_dir(tmp.path(), "beta", 15, &[]);
    let runs = [alpha.clone(), beta.clone()];
    let err = format!(
        "{:#}",
        plot_runs(&runs, None, &PlotOptions::default()).unwrap_err()
    );
    assert!(err.contains("-o FILE"), "{err}");
    let out = tmp.path().join("compare.svg");
    plot_runs(&runs, Some(&out), &PlotOptions::default()).unwrap();
    let texts = text_elements(&svg_of(&out));
    for name in ["alpha", "beta"] {
        assert!(
            texts.contains(&format!("{name} — graphs/g.toml")),
            "{texts:?}"
        );
        assert!(texts.contains(&format!("{name} train")), "{texts:?}");
        assert!(texts.contains(&format!("{name} val")), "{texts:?}");
        assert!(
            texts.contains(&name.to_string()),
            "pg_loss legend: {texts:?}"
        );
    }
    let missing = format!(
        "{:#}",
        plot_runs(
            &[alpha, tmp.path().join("gamma")],
            Some(&out),
            &PlotOptions::default()
        )
        .unwrap_err()
    );
    assert!(
        missing.contains("gamma: no such run directory or metrics file"),
        "{missing}"
    );
}

#[test]
fn verl_file_logger_lines_are_read_and_overlay_a_flowrl_run() {
    let tmp = tempfile::tempdir().unwrap();
    // verl's FileLogger (verl/utils/tracking.py) writes {"step": N, "data": {...}} per log call;
    // orjson writes NaN as null.
    let verl = tmp.path().join("logs/grpo/qwen.jsonl");
    let mut rows = vec![json!({"step": 0, "data": {"val-core/gsm8k/acc/mean@1": 0.2}})];
    rows.extend((1..=6).map(|s| {
        json!({"step": s, "data": {
            "critic/score/mean": 0.1 * s as f64,
            "actor/pg_loss": if s == 4 { Value::Null } else { json!(0.01) },
        }})
    }));
    write_rows(&verl, &rows);
    let run = RunMetrics::read(&verl).unwrap();
    assert_eq!(run.name, "qwen");
    assert_eq!(run.graph_file, None);
    assert_eq!(run.series["critic/score/mean"].len(), 6);
    assert_eq!(run.series["actor/pg_loss"][3], (4, None));
    assert!(!run.series.contains_key("data") && !run.series.contains_key("step"));
    let out = plot_runs(std::slice::from_ref(&verl), None, &PlotOptions::default()).unwrap();
    assert_eq!(out, tmp.path().join("logs/grpo/qwen.svg"));
    let texts = text_elements(&svg_of(&out));
    assert!(
        texts.contains(&"score: critic/score/mean".to_string()),
        "{texts:?}"
    );
    // verl's validation of its one data source is the accuracy panel's validation line.
    assert!(
        texts.contains(&"accuracy: val-core/gsm8k/acc/mean@1".to_string())
            && texts.contains(&"val gsm8k".to_string()),
        "{texts:?}"
    );
    assert!(
        texts.contains(&"non-finite at steps 4".to_string()),
        "{texts:?}"
    );

    let flowrl = run_dir(tmp.path(), "ours", 6, &[]);
    let both = tmp.path().join("both.svg");
    plot_runs(&[flowrl, verl], Some(&both), &PlotOptions::default()).unwrap();
    let texts = text_elements(&svg_of(&both));
    assert!(
        texts.contains(&"ours train".to_string()) && texts.contains(&"qwen train".to_string()),
        "the score panel holds both runs: {texts:?}"
    );
    assert!(
        texts.contains(&"ours val".to_string()) && texts.contains(&"qwen val gsm8k".to_string()),
        "the accuracy panel holds both runs' validation: {texts:?}"
    );
}

#[test]
fn smoothing_changes_only_dense_training_lines_and_only_when_asked() {
    let tmp = tempfile::tempdir().unwrap();
    let run = run_dir(tmp.path(), "r", 20, &[]);
    let draw = |smooth: f64, name: &str| {
        let out = tmp.path().join(name);
        plot_runs(
            std::slice::from_ref(&run),
            Some(&out),
            &PlotOptions { smooth },
        )
        .unwrap();
        svg_of(&out)
    };
    let plain = draw(0.0, "plain.svg");
    assert_eq!(plain, draw(0.0, "again.svg"), "drawing is deterministic");
    assert_eq!(
        plain,
        svg_of(&plot_run(&run, None).unwrap()),
        "off by default"
    );
    let smoothed = draw(0.6, "smoothed.svg");
    assert_ne!(plain, smoothed);
    // Each of the three training lines is drawn twice: faint as recorded, and smoothed.
    let faint = |svg: &str| svg.matches("opacity=\"0.3\"").count();
    assert_eq!(faint(&plain), 0);
    assert_eq!(faint(&smoothed), 3, "{smoothed}");

    // Validation only: nothing to smooth.
    let val: Vec<Value> = (0..=20)
        .step_by(5)
        .map(|s| json!({"step": s, "val/accuracy": 0.01 * s as f64}))
        .collect();
    let val_file = tmp.path().join("val/metrics.jsonl");
    write_rows(&val_file, &val);
    let val_dir = [val_file.parent().unwrap().to_path_buf()];
    let val_plain = tmp.path().join("val_plain.svg");
    let val_smoothed = tmp.path().join("val_smoothed.svg");
    plot_runs(&val_dir, Some(&val_plain), &PlotOptions { smooth: 0.0 }).unwrap();
    plot_runs(&val_dir, Some(&val_smoothed), &PlotOptions { smooth: 0.9 }).unwrap();
    assert_eq!(svg_of(&val_plain), svg_of(&val_smoothed));

    let err = format!(
        "{:#}",
        plot_runs(&[run], None, &PlotOptions { smooth: 1.0 }).unwrap_err()
    );
    assert!(err.contains("smoothing weight is 1"), "{err}");
}

#[test]
fn the_command_line_takes_several_runs_and_a_smoothing_weight() {
    #[derive(Parser)]
    struct Cli {
        #[command(subcommand)]
        command: Command,
    }
    let tmp = tempfile::tempdir().unwrap();
    let a = run_dir(tmp.path(), "a", 5, &[]);
    let b = run_dir(tmp.path(), "b", 5, &[]);
    let out = tmp.path().join("ab.svg");
    let cli = Cli::try_parse_from([
        "flowrl".as_ref(),
        "plot".as_ref(),
        a.as_os_str(),
        b.as_os_str(),
        "--smooth".as_ref(),
        "0.5".as_ref(),
        "-o".as_ref(),
        out.as_os_str(),
    ])
    .unwrap();
    let Command::Plot(args) = &cli.command else {
        panic!("not the plot command");
    };
    assert_eq!((args.runs.len(), args.smooth), (2, 0.5));
    execute(&cli.command, &testkit::registry());
    assert!(svg_of(&out).contains("opacity=\"0.3\""), "smoothed");
    assert!(
        Cli::try_parse_from(["flowrl", "plot"]).is_err(),
        "a run is required"
    );
}

#[test]
fn the_graph_page_is_titled_with_the_graph_file_name() {
    let text =
        "[run]\nsteps = 1\ndevice = \"cpu\"\n[nodes.src]\nkind = \"test.source\"\ncount = 2\n";
    let (graph, _) =
        flowrl_engine::compile::compile(&testkit::registry(), "graphs/my <graph>.toml", text, &[])
            .unwrap_or_else(|f| panic!("{}", f.render()));
    let html = export(&graph, Format::Html);
    assert!(
        html.contains("<title>my &lt;graph&gt;.toml</title>"),
        "{}",
        &html[..300.min(html.len())]
    );
}
