//! Batching: seeded shuffling, epochs, drop-last, and resuming from a saved data position.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use flowrl_datasets::dataset::{DataPosition, DatasetOptions, PromptDataset, Truncation};
use flowrl_datasets::encoder::PromptEncoder;
use flowrl_datasets::synth::{sample, write_split};
use flowrl_datasets::template::ChatTemplate;
use flowrl_datasets::verl::{ReadOptions, VerlColumns};

fn encoder() -> Arc<PromptEncoder> {
    let template = ChatTemplate::new(
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}\
         {% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
            .into(),
    )
    .unwrap();
    let tokenizer = flowrl_datasets::synth::train_tokenizer().unwrap();
    Arc::new(PromptEncoder::new(template, tokenizer, None))
}

/// `n` rows of the shapes task, read as text only (the `<image>` stays literal text).
fn file(dir: &Path, name: &str, n: u64) -> PathBuf {
    let samples: Vec<_> = (0..n).map(|i| sample(3, name, i)).collect();
    let path = dir.join(format!("{name}.parquet"));
    write_split(&path, name, &samples).unwrap();
    path
}

fn options(batch_size: usize, shuffle: bool, seed: u64) -> DatasetOptions {
    DatasetOptions {
        read: ReadOptions {
            columns: VerlColumns {
                image_key: None,
                ..VerlColumns::default()
            },
            ..ReadOptions::default()
        },
        max_prompt_length: 512,
        truncation: Truncation::Error,
        filter_overlong_prompts: false,
        batch_size,
        shuffle,
        seed,
    }
}

fn rows(b: &flowrl_datasets::PromptBatch) -> Vec<(PathBuf, usize)> {
    b.prompts
        .iter()
        .map(|p| (p.source.file.clone(), p.source.row))
        .collect()
}

#[test]
fn epochs_are_permutations_and_drop_the_last_partial_batch() {
    let dir = tempfile::tempdir().unwrap();
    let paths = vec![file(dir.path(), "a", 7), file(dir.path(), "b", 4)];
    let mut ds = PromptDataset::load(&paths, encoder(), options(3, true, 11)).unwrap();
    assert_eq!(ds.len(), 11);
    assert_eq!(ds.batches_per_epoch(), 3);
    let mut epochs = Vec::new();
    for _ in 0..2 {
        let mut seen = Vec::new();
        for _ in 0..3 {
            let b = ds.next_batch().unwrap();
            assert_eq!(b.len(), 3);
            seen.extend(rows(&b));
        }
        let unique: BTreeSet<_> = seen.iter().cloned().collect();
        assert_eq!(unique.len(), 9, "no prompt repeats within an epoch");
        epochs.push(seen);
    }
    assert_eq!(ds.position().epoch, 1);
    assert_ne!(epochs[0], epochs[1], "each epoch has its own order");
    // The 7th batch starts epoch 2.
    let b = ds.next_batch().unwrap();
    assert_eq!(b.epoch, 2);
    assert_eq!(b.prompts[0].uid, "e2-0");

    // Without shuffling the order is the files' order.
    let mut plain = PromptDataset::load(&paths, encoder(), options(4, false, 0)).unwrap();
    let b = plain.next_batch().unwrap();
    assert_eq!(
        rows(&b),
        (0..4).map(|r| (paths[0].clone(), r)).collect::<Vec<_>>()
    );
    let b = plain.next_batch().unwrap();
    assert_eq!(rows(&b)[3], (paths[1].clone(), 0));
}

#[test]
fn seeds_change_the_order_and_fix_it() {
    let dir = tempfile::tempdir().unwrap();
    let paths = vec![file(dir.path(), "a", 20)];
    let first = |seed| {
        let mut ds = PromptDataset::load(&paths, encoder(), options(5, true, seed)).unwrap();
        rows(&ds.next_batch().unwrap())
    };
    assert_eq!(first(1), first(1));
    assert_ne!(first(1), first(2));
}

#[test]
fn a_restored_position_gives_the_same_next_batches() {
    let dir = tempfile::tempdir().unwrap();
    let paths = vec![file(dir.path(), "a", 10)];
    let mut run = PromptDataset::load(&paths, encoder(), options(4, true, 5)).unwrap();
    for _ in 0..3 {
        run.next_batch().unwrap(); // crosses into epoch 1
    }
    let saved = run.position();
    let json = serde_json::to_string(&saved).unwrap();
    let expected: Vec<_> = (0..4).map(|_| run.next_batch().unwrap()).collect();

    // A new process: same files and options, position restored from its JSON.
    let mut resumed = PromptDataset::load(&paths, encoder(), options(4, true, 5)).unwrap();
    let restored: DataPosition = serde_json::from_str(&json).unwrap();
    assert_eq!(restored, saved);
    resumed.set_position(restored).unwrap();
    for want in &expected {
        let got = resumed.next_batch().unwrap();
        assert_eq!(&got, want);
    }
    // A position past the data is refused.
    let bad = DataPosition {
        epoch: 0,
        cursor: 11,
        seed: 5,
    };
    assert!(
        resumed
            .set_position(bad)
            .unwrap_err()
            .to_string()
            .contains("past the dataset")
    );
}

#[test]
fn batch_larger_than_dataset_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let paths = vec![file(dir.path(), "a", 3)];
    let mut ds = PromptDataset::load(&paths, encoder(), options(4, true, 5)).unwrap();
    let e = ds.next_batch().unwrap_err().to_string();
    assert!(
        e.contains("3 prompts (after filtering), fewer than batch_size 4"),
        "{e}"
    );
}
