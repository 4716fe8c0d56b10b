//! End-to-end tests of `flowrl generate` through the binary, on the tiny checkpoints: greedy
//! output equals the `rollout` node's (run as a graph on the same prompt), sampling is seeded,
//! the checkpoint's generation_config.json gives the defaults, and bad input fails early with
//! `flowrl run`'s exit codes.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_flowrl");
const QWEN: &str = "assets/tiny-qwen2-vl";
const GEMMA: &str = "assets/tiny-gemma4";
const SHAPES: &str = "datasets/shapes/test.parquet";

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Runs the binary in the repository root, `stdin` piped in.
fn flowrl_with_stdin(args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(BIN)
        .args(args)
        .current_dir(root())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

fn flowrl(args: &[&str]) -> Output {
    flowrl_with_stdin(args, "")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `flowrl generate --json ARGS` on the CPU, which must succeed.
fn generate_json(args: &[&str]) -> Value {
    let mut all = vec!["generate", "--json", "--device", "cpu"];
    all.extend_from_slice(args);
    let out = flowrl(&all);
    assert!(out.status.success(), "{all:?}: {}", stderr(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The output without its wall-clock entries.
fn without_timings(mut v: Value) -> Value {
    let map = v.as_object_mut().unwrap();
    for k in ["seconds", "load_seconds", "tokens_per_second"] {
        assert!(map.remove(k).unwrap().as_f64().unwrap() >= 0.0, "{k}");
    }
    v
}

fn u32s(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn f64s(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

/// Row 0 of the shapes test split: its user text without the leading `<image>`, and its picture
/// written to `dir`.
fn shapes_row0(dir: &Path) -> (String, PathBuf) {
    let file = flowrl_datasets::read_verl_file(&root().join(SHAPES), &Default::default()).unwrap();
    let row = &file.rows[0];
    assert_eq!(row.messages.len(), 1);
    let text = row.messages[0]
        .content
        .strip_prefix("<image>")
        .expect("the row's picture comes first")
        .to_string();
    let png = dir.join("row0.png");
    std::fs::write(&png, &row.images[0].bytes).unwrap();
    (text, png)
}

/// A copy of a model directory without its weights (enough for the checks before loading) or
/// with them, minus the files named in `drop`.
fn model_copy(model: &str, dir: &Path, drop: &[&str]) -> PathBuf {
    let to = dir.join("model");
    std::fs::create_dir_all(&to).unwrap();
    for entry in std::fs::read_dir(root().join(model)).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap();
        if !drop.contains(&name) {
            std::fs::copy(&path, to.join(name)).unwrap();
        }
    }
    to
}

/// The `rollout` node's greedy response to shapes row 0, from a one-step graph run through the
/// binary: dataset.parquet (that row) → rollout (greedy) → sink.jsonl.
fn rollout_node_greedy(model: &str, max_new_tokens: usize, dir: &Path) -> Value {
    let graph = format!(
        r#"
[run]
steps = 1
seed = 3
device = "cpu"

[models.policy]
path = "{model}"
trainable = false

[nodes.data]
kind = "dataset.parquet"
model = "policy"
path = "{SHAPES}"
batch_size = 1
shuffle = false
max_prompt_length = 256

[nodes.rollout]
kind = "rollout"
model = "policy"
inputs = {{ prompts = "data.prompts" }}
greedy = true
max_new_tokens = {max_new_tokens}

[nodes.sink]
kind = "sink.jsonl"
inputs = {{ rollouts = "rollout.rollouts" }}
path = "rollouts.jsonl"
"#,
        model = root().join(model).display()
    );
    let path = dir.join("graph.toml");
    std::fs::write(&path, graph).unwrap();
    let run_dir = dir.join("run");
    let out = flowrl(&[
        "run",
        path.to_str().unwrap(),
        "--out",
        run_dir.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let line = std::fs::read_to_string(run_dir.join("rollouts.jsonl")).unwrap();
    let v: Value = serde_json::from_str(line.trim()).unwrap();
    v["rollouts"].clone()
}

/// Greedy `flowrl generate` on shapes row 0 is deterministic and answers what the rollout node
/// answers: prompt ids, response ids, log-probs, text, finish reason.
fn assert_greedy_matches_rollout_node(model: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let (text, png) = shapes_row0(tmp.path());
    let args = [
        "--model",
        model,
        "--image",
        png.to_str().unwrap(),
        "--prompt",
        &text,
        "--temperature",
        "0",
        "--max-new-tokens",
        "16",
    ];
    let a = generate_json(&args);
    let b = generate_json(&args);
    assert_eq!(without_timings(a.clone()), without_timings(b), "{model}");
    assert_eq!(a["decoding"]["greedy"], true);
    assert_eq!(a["device"], "cpu:0");
    assert_eq!(a["precision"], "f32");
    assert!(a["num_image_tokens"].as_u64().unwrap() > 0);

    let node = rollout_node_greedy(model, 16, tmp.path());
    let ids = u32s(&a["response_ids"]);
    assert!(!ids.is_empty());
    assert_eq!(ids, u32s(&node["response_ids"][0]), "{model}: response ids");
    assert_eq!(
        a["prompt_length"], node["prompt_lengths"][0],
        "{model}: prompt length"
    );
    assert_eq!(a["text"], node["response_text"][0], "{model}: text");
    let node_logps = &f64s(&node["sampling_log_probs"]["data"])[..ids.len()];
    assert_eq!(
        f64s(&a["response_log_probs"]),
        node_logps,
        "{model}: log-probs"
    );
    let truncated = node["truncated"][0].as_bool().unwrap();
    assert_eq!(a["stopped"], !truncated);
    assert_eq!(
        a["finish_reason"],
        if truncated { "length" } else { "stop" }
    );

    // The rendered template is the dataset's (its prompt ids are the node's input).
    let rendered = a["prompt_text"].as_str().unwrap();
    assert!(rendered.contains(&text), "{rendered}");
}

#[test]
fn greedy_qwen2_vl_matches_the_rollout_node() {
    assert_greedy_matches_rollout_node(QWEN);
}

#[test]
fn greedy_gemma4_matches_the_rollout_node() {
    assert_greedy_matches_rollout_node(GEMMA);
}

#[test]
fn sampling_is_seeded_and_log_probs_are_the_responses() {
    let tmp = tempfile::tempdir().unwrap();
    let (text, png) = shapes_row0(tmp.path());
    let sample = |seed: &str| {
        generate_json(&[
            "--model",
            QWEN,
            "--image",
            png.to_str().unwrap(),
            "--prompt",
            &text,
            "--temperature",
            "1.5",
            "--max-new-tokens",
            "24",
            "--seed",
            seed,
        ])
    };
    let first = sample("1");
    assert_eq!(without_timings(first.clone()), without_timings(sample("1")));
    assert_eq!(first["decoding"]["greedy"], false);
    let responses: Vec<Value> = ["1", "2", "3", "4"].iter().map(|s| sample(s)).collect();
    assert!(
        responses
            .iter()
            .any(|r| r["response_ids"] != first["response_ids"]),
        "four seeds gave one response: {}",
        first["response_ids"]
    );

    let tokenizer = flowrl_datasets::encoder::load_tokenizer(&root().join(QWEN)).unwrap();
    for r in &responses {
        let ids = u32s(&r["response_ids"]);
        let logps = f64s(&r["response_log_probs"]);
        assert_eq!(ids.len(), logps.len());
        assert_eq!(r["response_length"], ids.len());
        assert!(
            logps.iter().all(|l| l.is_finite() && *l <= 0.0),
            "{logps:?}"
        );
        assert_eq!(r["text"], tokenizer.decode(&ids, true).unwrap());
        let stopped = r["stopped"].as_bool().unwrap();
        assert!(stopped || ids.len() == 24, "cut before max_new_tokens");
    }
}

#[test]
fn defaults_come_from_generation_config_and_flags_override_them() {
    let plain = generate_json(&["--model", QWEN, "--prompt", "What shape is shown?"]);
    assert_eq!(plain["decoding"]["defaults"], "built-in");
    assert_eq!(plain["decoding"]["greedy"], true);
    assert_eq!(plain["decoding"]["max_new_tokens"], 256);
    assert_eq!(plain["num_image_tokens"], 0);

    let tmp = tempfile::tempdir().unwrap();
    let model = model_copy(QWEN, tmp.path(), &[]);
    std::fs::write(
        model.join("generation_config.json"),
        r#"{"do_sample": true, "temperature": 0.8, "top_p": 0.9, "top_k": 5, "max_new_tokens": 5, "eos_token_id": 410}"#,
    )
    .unwrap();
    let model = model.to_str().unwrap();
    // The prompt from standard input.
    let mut args = vec!["generate", "--json", "--device", "cpu", "--model", model];
    args.extend(["--prompt", "-"]);
    let out = flowrl_with_stdin(&args, "What shape is shown?");
    assert!(out.status.success(), "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let d = &v["decoding"];
    assert_eq!(d["defaults"], "generation_config.json");
    assert_eq!(d["greedy"], false);
    assert_eq!(d["temperature"], 0.8);
    assert_eq!(d["top_p"], 0.9);
    assert_eq!(d["top_k"], 5);
    assert_eq!(d["max_new_tokens"], 5);
    assert!(v["response_length"].as_u64().unwrap() <= 5);
    assert_eq!(v["prompt_ids"], plain["prompt_ids"]);

    let greedy = generate_json(&[
        "--model",
        model,
        "--prompt",
        "What shape is shown?",
        "--temperature",
        "0",
        "--max-new-tokens",
        "9",
    ]);
    assert_eq!(greedy["decoding"]["greedy"], true);
    assert_eq!(greedy["decoding"]["max_new_tokens"], 9);
    let plain_ids = u32s(&plain["response_ids"]);
    let ids = u32s(&greedy["response_ids"]);
    assert_eq!(ids[..], plain_ids[..ids.len()], "greedy is greedy");

    // Without --json: the response text on stdout.
    let out = flowrl(&[
        "generate",
        "--device",
        "cpu",
        "--model",
        QWEN,
        "--prompt",
        "What shape is shown?",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        String::from_utf8(out.stdout)
            .unwrap()
            .trim_end_matches('\n'),
        plain["text"].as_str().unwrap()
    );
}

/// Runs `flowrl generate ARGS`, which must fail with `code` and a message containing `needles`.
fn assert_fails(args: &[&str], code: i32, needles: &[&str]) -> String {
    let mut all = vec!["generate"];
    all.extend_from_slice(args);
    let out = flowrl(&all);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(code), "{all:?}: {err}");
    for n in needles {
        assert!(err.contains(n), "{all:?}: `{n}` not in: {err}");
    }
    assert!(out.stdout.is_empty(), "{all:?}");
    err
}

#[test]
fn bad_input_fails_before_loading_with_run_exit_codes() {
    let tmp = tempfile::tempdir().unwrap();
    let (_, png) = shapes_row0(tmp.path());
    let png = png.to_str().unwrap();

    // The model directory.
    assert_fails(
        &["--model", "assets/no-such-model", "--prompt", "hi"],
        1,
        &["`assets/no-such-model` does not exist"],
    );
    assert_fails(
        &["--model", "datasets/shapes", "--prompt", "hi"],
        1,
        &["has no config.json: not a Hugging Face model directory"],
    );

    // Images: missing, not a picture, for a model that reads text only.
    let missing = tmp.path().join("missing.png");
    assert_fails(
        &["--model", QWEN, "--image", missing.to_str().unwrap()],
        1,
        &["cannot read --image", "missing.png"],
    );
    let garbage = tmp.path().join("garbage.png");
    std::fs::write(&garbage, b"not a picture").unwrap();
    assert_fails(
        &["--model", QWEN, "--image", garbage.to_str().unwrap()],
        1,
        &["garbage.png", "neither PNG nor JPEG"],
    );
    let text_only = model_copy(QWEN, tmp.path(), &["preprocessor_config.json"]);
    assert_fails(
        &["--model", text_only.to_str().unwrap(), "--image", png],
        1,
        &["has no image processor (no preprocessor_config.json)"],
    );

    // The context: tiny Qwen2-VL has 512 positions.
    assert_fails(
        &["--model", QWEN, "--image", png, "--max-new-tokens", "500"],
        1,
        &["exceeds the context", "512 tokens", "give --max-new-tokens"],
    );

    // Usage (exit 2).
    assert_fails(&["--model", QWEN], 2, &["nothing to generate from"]);
    assert_fails(
        &[
            "--model",
            QWEN,
            "--prompt",
            "<image><image>two?",
            "--image",
            png,
        ],
        2,
        &["places 2 image(s)", "1 --image file(s)"],
    );
    assert_fails(
        &["--model", QWEN, "--prompt", "x", "--precision", "f16"],
        2,
        &["f16"],
    );
    assert_fails(
        &["--model", QWEN, "--prompt", "x", "--temperature", "-1"],
        2,
        &["-1"],
    );
    assert_fails(
        &["--model", QWEN, "--prompt", "x", "--top-p", "0"],
        2,
        &["(0, 1]"],
    );

    // The device: `flowrl run`'s parsing, message and exit code 78.
    let run_err = |device: &str| {
        let out = flowrl(&["run", "graphs/grpo_vlm.toml", "--device", device]);
        assert_eq!(out.status.code(), Some(78));
        stderr(&out)
    };
    let err = assert_fails(
        &["--model", QWEN, "--prompt", "x", "--device", "gpu"],
        78,
        &["error[E0106]: `gpu` is not a device"],
    );
    assert_eq!(err.lines().next(), run_err("gpu").lines().next());
    let err = assert_fails(
        &["--model", QWEN, "--prompt", "x", "--device", "cuda:99"],
        78,
        &["error[E0701]: the model is placed on cuda:99, but "],
    );
    let reason = |e: &str| {
        e.lines()
            .next()
            .unwrap()
            .split(", but ")
            .nth(1)
            .unwrap()
            .to_string()
    };
    let run = run_err("cuda:99");
    assert_eq!(reason(&err), reason(&run));
    let help = |e: &str| {
        e.lines()
            .find(|l| l.contains("= help:"))
            .map(str::to_string)
    };
    assert_eq!(help(&err), help(&run));
}
