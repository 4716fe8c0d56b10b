//! Multi-turn trajectories against transformers' rendering of the same conversations
//! (`tests/fixtures/tools/`: a tool message holding a picture, per family), with the policy's
//! turns taken from the reference as if sampled.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use flowrl_datasets::{ChatMessage, Prompt, RowRef};
use flowrl_engine::DeviceSpec;
use flowrl_models::PaddedBatch;
use flowrl_models::weights::Precision;
use image::RgbImage;
use serde_json::Map;

use super::row::Row;
use super::turns::fitting_groups;
use super::*;
use crate::runtime::backend::HostBackend;
use crate::tools::zoom::{Coordinates, Crop, CropParams};
use crate::tools::{Tool, ToolOutput};
use crate::train::sequences::SequenceBatch;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The case folders: those whose `case.json` is a `tool_conversation`.
fn cases() -> Vec<(PathBuf, Json)> {
    let dir = root().join("tests/fixtures/tools");
    let mut out: Vec<(PathBuf, Json)> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| {
            let path = e.ok()?.path();
            let text = std::fs::read_to_string(path.join("case.json")).ok()?;
            let json: Json = serde_json::from_str(&text).ok()?;
            (json["kind"] == "tool_conversation").then_some((path, json))
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    assert!(
        !out.is_empty(),
        "no tool conversation under {}",
        dir.display()
    );
    out
}

fn ids_of(v: &Json) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn picture(path: &Path) -> RgbImage {
    image::open(path).unwrap().to_rgb8()
}

/// A `zoom_in` that cuts with the crate's crop tool and answers with the reference's tool
/// texts, in order: a reference answer without a picture is an error message.
struct Replay {
    crop: Crop,
    answers: Mutex<VecDeque<(String, bool)>>,
}

impl Tool for Replay {
    fn function(&self, name: &str) -> Json {
        self.crop.function(name)
    }

    fn call(
        &self,
        arguments: &Map<String, Json>,
        pictures: &[Arc<RgbImage>],
    ) -> Result<ToolOutput, String> {
        let (text, with_picture) = self.answers.lock().unwrap().pop_front().unwrap();
        if !with_picture {
            return Err(text);
        }
        let out = self.crop.call(arguments, pictures)?;
        Ok(ToolOutput {
            text,
            pictures: out.pictures,
        })
    }
}

/// The reference's tool answers: (text, whether it holds a picture).
fn tool_answers(case: &Json) -> VecDeque<(String, bool)> {
    case["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| {
            let parts = m["content"].as_array().unwrap();
            let text = parts
                .iter()
                .find(|p| p["type"] == "text")
                .map(|p| p["text"].as_str().unwrap().to_string())
                .unwrap();
            (text, parts.iter().any(|p| p["type"] == "image"))
        })
        .collect()
}

/// The multi-turn rollout of a case's model, with the replaying tool.
fn multi_turn(dir: &Path, case: &Json) -> (MultiTurn, Arc<PromptEncoder>) {
    let model_dir = root().join(case["model_dir"].as_str().unwrap());
    let random = (!model_dir.join("model.safetensors").exists()).then_some(3);
    let model = Arc::new(
        ModelResource::load(
            "policy",
            &model_dir,
            false,
            random,
            DeviceSpec::Cpu(0),
            Some(Precision::F32),
        )
        .unwrap(),
    );
    let encoder = Arc::new(PromptEncoder::from_model_dir(&model_dir).unwrap());
    let crop = Crop::new(
        CropParams {
            coordinates: Coordinates::Pixel,
            min_size: 28,
            scale: None,
        },
        1.0,
    )
    .unwrap();
    let tools = ToolSet::default().with(
        "zoom_in",
        Arc::new(Replay {
            crop,
            answers: Mutex::new(tool_answers(case)),
        }),
    );
    let rollout = RolloutParams {
        model: "policy".into(),
        n: 1,
        greedy: true,
        max_new_tokens: 2048,
        temperature: 1.0,
        top_p: 1.0,
        top_k: -1,
        stop: Vec::new(),
        kv_cache_gib: 1.0,
        max_num_batched_tokens: 8192,
    };
    let turns = TurnParams {
        max_tokens_per_turn: None,
        max_turns: 8,
        max_tool_calls: 8,
        max_parallel_calls: 1,
        format: if case["family"] == "gemma4" {
            "gemma4"
        } else {
            "hermes"
        }
        .into(),
        replay_turns: None,
        tools: serde_json::json!({"zoom_in": {}}),
    };
    let _ = dir;
    let mut mt = MultiTurn::new(rollout, turns, model).unwrap();
    mt.tools = tools;
    (mt, encoder)
}

/// The case's prompt, encoded by flowrl from its first message and picture.
fn prompt(dir: &Path, case: &Json, encoder: &PromptEncoder) -> Arc<PromptBatch> {
    let user = &case["messages"][0]["content"];
    let mut content = String::new();
    for part in user.as_array().unwrap() {
        match part["type"].as_str().unwrap() {
            "image" => content.push_str("<image>"),
            _ => content.push_str(part["text"].as_str().unwrap()),
        }
    }
    let messages = vec![ChatMessage {
        role: "user".into(),
        content,
    }];
    let image = picture(&dir.join(case["images"][0].as_str().unwrap()));
    let encoded = encoder
        .encode(&messages, std::slice::from_ref(&image), true)
        .unwrap();
    let prompt = Prompt {
        uid: "e0-0".into(),
        input_ids: encoded.input_ids,
        images: encoded.images,
        pictures: vec![Arc::new(image)],
        messages,
        text: encoded.text,
        ground_truth: "red".into(),
        data_source: "test".into(),
        ability: None,
        extra_info: Json::Null,
        source: RowRef {
            file: "case.json".into(),
            row: 0,
        },
    };
    Arc::new(PromptBatch::encoded_by(encoder, vec![prompt], 0))
}

/// The case's conversation, turn by turn through the node's own code: the reference's
/// assistant spans as the sampled turns.
fn replay(dir: &Path, case: &Json) -> (MultiTurn, Arc<PromptEncoder>, RolloutBatch) {
    let (mt, encoder) = multi_turn(dir, case);
    let prompts = prompt(dir, case, &encoder);
    let reference = ids_of(&case["input_ids"]);
    let prompt_len = case["prompt_len"].as_u64().unwrap() as usize;
    assert_eq!(
        prompts.prompts[0].input_ids,
        reference[..prompt_len],
        "{}: the prompt's ids",
        case["case"]
    );
    let history = mt.prompt_messages(&prompts.prompts[0]).unwrap();
    let mut row = Row::new(0);
    let spans = case["assistant_spans"].as_array().unwrap();
    for (turn, span) in spans.iter().enumerate() {
        let (a, b) = (
            span[0].as_u64().unwrap() as usize,
            span[1].as_u64().unwrap() as usize,
        );
        assert_eq!(
            prompt_len + row.ids.len(),
            a,
            "{}: turn {turn} starts where the reference's does",
            case["case"]
        );
        let tokens = &reference[a..b];
        let log_probs: Vec<f32> = (0..tokens.len()).map(|k| -(k as f32) - 1.0).collect();
        mt.after_turn(
            &mut row,
            tokens,
            &log_probs,
            true,
            turn,
            &prompts.prompts[0],
            &history,
            &encoder.tokenizer,
        )
        .unwrap();
    }
    row.finish.get_or_insert(Finish::Stop);
    let batch = mt.batch(&prompts, vec![row]).unwrap();
    (mt, encoder, batch)
}

#[test]
fn trajectories_match_transformers_rendering_token_for_token() {
    for (dir, case) in cases() {
        let name = case["case"].as_str().unwrap().to_string();
        let (_, _, batch) = replay(&dir, &case);
        let reference = ids_of(&case["input_ids"]);
        let prompt_len = case["prompt_len"].as_u64().unwrap() as usize;
        let spans: Vec<(usize, usize)> = case["assistant_spans"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                (
                    s[0].as_u64().unwrap() as usize,
                    s[1].as_u64().unwrap() as usize,
                )
            })
            .collect();
        let end = spans.last().unwrap().1;
        // Token in, token out: the whole conversation, tool answers and pictures included.
        assert_eq!(
            batch.response_ids[0],
            reference[prompt_len..end],
            "{name}: the response's ids"
        );
        // Loss mask 1 exactly on the policy's turns; their log-probs kept, 0 elsewhere.
        let mask = batch.response_mask.row(0);
        let logps = batch.sampling_log_probs.row(0);
        for (k, &m) in mask.iter().enumerate() {
            let at = prompt_len + k;
            let policy = spans.iter().any(|&(a, b)| (a..b).contains(&at));
            assert_eq!(m, f32::from(u8::from(policy)), "{name}: mask at token {at}");
            if !policy {
                assert_eq!(logps[k], 0.0, "{name}: log-prob at template token {at}");
            }
        }
        let t = &batch.trajectories[0];
        assert_eq!(t.turns(), spans.len(), "{name}");
        let tool_pictures = case["crops"].as_array().unwrap();
        assert_eq!(t.images.len(), tool_pictures.len(), "{name}: tool pictures");
        // The crop tool's picture is Pillow's crop of the same box, pixel for pixel.
        for (k, crop) in tool_pictures.iter().enumerate() {
            let expected = picture(&dir.join(crop["file"].as_str().unwrap()));
            assert_eq!(
                t.pictures[k].as_ref(),
                &expected,
                "{name}: tool picture {k}"
            );
        }
        let counts = ids_of(&case["image_token_counts"]);
        let ours: Vec<u32> = batch.prompts.prompts[0]
            .images
            .iter()
            .chain(&t.images)
            .map(|i| i.num_tokens as u32)
            .collect();
        assert_eq!(ours, counts, "{name}: image tokens per picture");
        let errors = tool_answers(&case).iter().filter(|a| !a.1).count();
        assert_eq!(t.tool_errors, errors, "{name}: tool errors counted");
        assert_eq!(t.tool_calls, spans.len() - 1, "{name}: tool calls counted");
    }
}

#[test]
fn tool_pictures_are_positioned_as_transformers_positions_them() {
    for (dir, case) in cases() {
        let name = case["case"].as_str().unwrap().to_string();
        let (mt, _, batch) = replay(&dir, &case);
        let model = mt
            .model
            .inference_model::<crate::runtime::backend::CpuBackend>()
            .unwrap();
        let mut ids = batch.prompt_ids[0].clone();
        ids.extend_from_slice(&batch.response_ids[0]);
        let len = ids.len();
        let tokens = PaddedBatch {
            ids,
            attention_mask: vec![1; len],
            batch: 1,
            len,
        };
        let mut images = batch.prompts.prompts[0].images.clone();
        images.extend(batch.response_images(0).iter().cloned());
        let positions = model.position_ids(&tokens, &images).unwrap();
        let reference = &case["position_ids"];
        let expected: Vec<i64> = match reference[0].as_array() {
            Some(_) => reference
                .as_array()
                .unwrap()
                .iter()
                .flat_map(|stream| stream.as_array().unwrap()[..len].to_vec())
                .map(|x| x.as_i64().unwrap())
                .collect(),
            None => reference.as_array().unwrap()[..len]
                .iter()
                .map(|x| x.as_i64().unwrap())
                .collect(),
        };
        assert_eq!(positions.ids, expected, "{name}: position ids");
    }
}

/// The update and log-prob nodes see the tool pictures: a trajectory's response log-probs
/// through the training layout equal one forward pass over the whole conversation with every
/// picture, at the policy's tokens.
#[test]
fn training_sequences_carry_the_tool_pictures() {
    let (dir, case) = cases()
        .into_iter()
        .find(|(_, c)| {
            c["family"] == "qwen2_vl" && c["crops"].as_array().is_some_and(|a| !a.is_empty())
        })
        .expect("a Qwen2-VL case with a tool picture");
    let (mt, _, batch) = replay(&dir, &case);
    let device = Default::default();
    let model = mt
        .model
        .inference_model::<crate::runtime::backend::CpuBackend>()
        .unwrap();
    let model: flowrl_models::Model<HostBackend> = model;
    let seq = SequenceBatch::new(&batch, &[0]).unwrap();
    let ours = seq.log_probs(&model, 1.0, 16, &device).unwrap();
    let ours: Vec<f32> = ours.log_probs.into_data().into_vec().unwrap();
    let mut ids = batch.prompt_ids[0].clone();
    ids.extend_from_slice(&batch.response_ids[0]);
    let len = ids.len();
    let tokens = PaddedBatch {
        ids: ids.clone(),
        attention_mask: vec![1; len],
        batch: 1,
        len,
    };
    let mut images = batch.prompts.prompts[0].images.clone();
    images.extend(batch.response_images(0).iter().cloned());
    let logits = model.logits(&tokens, &images, &device).unwrap();
    let vocab = logits.dims()[2];
    let logits: Vec<f32> = logits.into_data().into_vec().unwrap();
    let p = batch.prompt_ids[0].len();
    let mask = batch.response_mask.row(0);
    let mut max_diff = 0.0f32;
    for t in 0..batch.response_ids[0].len() {
        if mask[t] < 0.5 {
            continue;
        }
        let row = &logits[(p + t - 1) * vocab..(p + t) * vocab];
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let lse = max + row.iter().map(|x| (x - max).exp()).sum::<f32>().ln();
        let expected = row[ids[p + t] as usize] - lse;
        max_diff = max_diff.max((expected - ours[t]).abs());
    }
    assert!(max_diff < 1e-4, "log-probs differ by {max_diff}");
    // Without the tool picture the same ids cannot even be embedded: the check names it.
    let mut broken = batch.clone();
    let mut t = (*broken.trajectories[0]).clone();
    t.images.clear();
    t.pictures.clear();
    for s in &mut t.segments {
        s.images = 0;
    }
    broken.trajectories[0] = Arc::new(t);
    let err = check_trajectory(&broken, 0, mt.template.encoder()).unwrap_err();
    assert!(
        err.to_string().contains("response 0 (prompt e0-0)")
            && err.to_string().contains("image tokens"),
        "{err}"
    );
}

/// Two prompts of a case (the same conversation under two uids).
fn two_prompts(dir: &Path, case: &Json, encoder: &PromptEncoder) -> Arc<PromptBatch> {
    let one = prompt(dir, case, encoder);
    let mut batch = (*one).clone();
    let mut second = batch.prompts[0].clone();
    second.uid = "e0-1".into();
    batch.prompts.push(second);
    Arc::new(batch)
}

/// The first Qwen2-VL case and its multi-turn rollout with the crate's own `zoom_in` tool.
fn qwen2_vl_with_zoom() -> (PathBuf, Json, MultiTurn, Arc<PromptEncoder>) {
    let (dir, case) = cases()
        .into_iter()
        .find(|(_, c)| c["family"] == "qwen2_vl")
        .unwrap();
    let (mut mt, encoder) = multi_turn(&dir, &case);
    mt.tools = ToolSet::from_spec(&serde_json::json!({"zoom_in": {}})).unwrap();
    (dir, case, mt, encoder)
}

/// Without tool calls a multi-turn response is a rollout's: greedy, the same tokens as the
/// `rollout` kind's; sampled, the same whether one replica or two run the rows.
#[test]
fn one_turn_is_a_rollout_and_replicas_agree() {
    let (dir, case, mut mt, encoder) = qwen2_vl_with_zoom();
    mt.rollout.n = 3;
    mt.rollout.max_new_tokens = 24;
    let prompts = two_prompts(&dir, &case, &encoder);
    let single = Replicas::single(DeviceSpec::Cpu(0));
    let greedy = mt.sample(&prompts, &single, 5).unwrap();
    let reference =
        super::super::sample_rollouts_seeded(&mt.model, &prompts, &mt.rollout, &[], &single, 5)
            .unwrap();
    assert!(greedy.trajectories.iter().all(|t| t.tool_calls == 0));
    assert_eq!(greedy.response_ids, reference.response_ids);
    assert_eq!(greedy.response_mask, reference.response_mask);
    assert_eq!(greedy.response_text, reference.response_text);

    mt.rollout.greedy = false;
    let one = mt.sample(&prompts, &single, 11).unwrap();
    let placement = flowrl_engine::Placement {
        devices: vec![DeviceSpec::Cpu(0), DeviceSpec::Cpu(1)],
        cluster: None,
    };
    let two = mt
        .sample(&prompts, &Replicas::new(&placement, "rollout").unwrap(), 11)
        .unwrap();
    assert_eq!(one.response_ids, two.response_ids);
    let diff = one
        .sampling_log_probs
        .data
        .iter()
        .zip(&two.sampling_log_probs.data)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(diff < 1e-4, "sampling log-probs differ by {diff}");
    assert_eq!(one.trajectories, two.trajectories);
}

/// Replayed turns (`replay_turns`, teacher forcing) give the conversation the reference
/// renders: the turns tokenized with the EOS, the tools run, the template between them.
#[test]
fn replayed_turns_rebuild_the_reference_conversation() {
    for (dir, case) in cases() {
        let name = case["case"].as_str().unwrap().to_string();
        let (mut mt, encoder) = multi_turn(&dir, &case);
        mt.turns.replay_turns = Some("turns".into());
        let texts: Vec<Json> = case["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["role"] == "assistant")
            .map(|m| m["content"].clone())
            .collect();
        let mut batch = (*prompt(&dir, &case, &encoder)).clone();
        batch.prompts[0].extra_info = serde_json::json!({ "turns": texts });
        let out = mt
            .sample(&Arc::new(batch), &Replicas::single(DeviceSpec::Cpu(0)), 0)
            .unwrap();
        let reference = ids_of(&case["input_ids"]);
        let prompt_len = case["prompt_len"].as_u64().unwrap() as usize;
        let end = case["assistant_spans"].as_array().unwrap().last().unwrap()[1]
            .as_u64()
            .unwrap() as usize;
        assert_eq!(out.response_ids[0], reference[prompt_len..end], "{name}");
        assert_eq!(out.trajectories[0].finish, Finish::Stop, "{name}");
    }
}

/// A chat template that writes the tools (a `tools` block, as Qwen2.5's and Qwen3's do) gets
/// the prompts encoded again with them; the pictures stay placed.
#[test]
fn templates_that_write_tools_see_them_in_the_prompt() {
    let (dir, case, mut mt, encoder) = qwen2_vl_with_zoom();
    mt.rollout.max_new_tokens = 8;
    let source = format!(
        "{{% if tools %}}<|im_start|>system\n# Tools\n{{% for t in tools %}}{{{{ t.function.name }}}}\n{{% endfor %}}<|im_end|>\n{{% endif %}}{}",
        encoder.template.source()
    );
    let with_tools = Arc::new(PromptEncoder::new(
        flowrl_datasets::ChatTemplate::new(source).unwrap(),
        encoder.tokenizer.clone(),
        encoder.processor.clone(),
    ));
    mt.template = TurnTemplate::new(with_tools, "policy", mt.tools.functions()).unwrap();
    // The dataset's prompt, encoded without the tools.
    let prompts = prompt(&dir, &case, &encoder);
    let out = mt
        .sample(&prompts, &Replicas::single(DeviceSpec::Cpu(0)), 1)
        .unwrap();
    let text = encoder.tokenizer.decode(&out.prompt_ids[0], false).unwrap();
    assert!(
        text.starts_with("<|im_start|>system\n# Tools\nzoom_in\n<|im_end|>"),
        "{text}"
    );
    assert_eq!(
        &out.prompt_ids[0][out.prompt_ids[0].len() - prompts.prompts[0].input_ids.len()..],
        prompts.prompts[0].input_ids.as_slice(),
        "the rest of the prompt, pictures included, is the dataset's"
    );
    check_trajectory(&out, 0, mt.template.encoder()).unwrap();
}

/// Rows whose longest context and largest limit would pass the model's context together are
/// generated in separate calls; each group fits, longest contexts first.
#[test]
fn a_turns_rows_are_grouped_to_fit_the_context() {
    // Contexts 341 and 120 with limits 20 and 175: together 341 + 175 > 512.
    let groups = fitting_groups(&[120, 341, 300], &[175, 20, 60], 512);
    assert_eq!(groups, vec![vec![1, 2], vec![0]]);
    for g in &groups {
        let longest = g.iter().map(|&j| [120, 341, 300][j]).max().unwrap();
        let limit = g.iter().map(|&j| [175, 20, 60][j]).max().unwrap();
        assert!(longest + limit <= 512);
    }
    assert_eq!(fitting_groups(&[10, 20], &[5, 5], 512), vec![vec![1, 0]]);
    assert!(fitting_groups(&[], &[], 512).is_empty());
}
