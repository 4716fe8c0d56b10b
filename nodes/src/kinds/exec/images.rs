//! The pictures of an exec node's inputs as PNG files (`images = true`): the program gets file
//! paths in its request, not pixels, so a CLIP or VLM-API judge needs no image transport of its
//! own (docs/exec-protocol.md, "Images").
//!
//! A step's pictures go to `<run dir>/exec_images/<node>/step_NNNNNN/` (absolute paths, so the
//! program's working directory does not matter; without a run directory, a temporary folder
//! removed with the node), each written once per step: the prompts' pictures as
//! `prompt<j>_image<k>.png`, the pictures tools returned in a multi-turn rollout as
//! `response<m>_tool_image<k>.png`. `j` and `m` number the step's prompts and responses batch by
//! batch, in the order the batches reach the node: with one request per step, `j` is the
//! response's `prompt_index` and `m` its row. Further requests within the step (an eval node's
//! chunks) continue the numbering in the same folder.
//!
//! Disk use: unless `keep_images`, only the latest step's folder is kept: the previous one is
//! removed when the next step's is made, and the step folders an earlier run left in the same
//! directory when the node makes its first.

use crate::values::{PromptBatch, RolloutBatch};
use image::RgbImage;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Where one exec node writes its pictures.
pub struct ImageFolder {
    /// `<run dir>/exec_images/<node>`, absolute, or the temporary folder.
    root: PathBuf,
    /// The root is a temporary folder (no run directory), removed on drop.
    temporary: bool,
    /// Keep every step's folder instead of the latest only.
    keep: bool,
    /// Whether the step folders of an earlier run have been cleared.
    cleared: bool,
    step: Option<StepFolder>,
}

/// The folder of the current step and the numbering of its files.
struct StepFolder {
    step: u64,
    dir: PathBuf,
    /// The current request's prompt batches (by address: they live as long as its inputs) and
    /// the number of each one's first prompt.
    prompt_batches: Vec<(usize, usize)>,
    next_prompt: usize,
    /// The same for batches of responses.
    rollout_batches: Vec<(usize, usize)>,
    next_response: usize,
}

static NEXT_TEMPORARY: AtomicU64 = AtomicU64::new(0);

impl ImageFolder {
    /// The folder of node `node`: under `run_dir` when there is one, else a temporary folder.
    pub fn new(run_dir: Option<&Path>, node: &str, keep: bool) -> Result<ImageFolder, String> {
        let (root, temporary) = match run_dir {
            Some(d) => {
                let root = d.join("exec_images").join(node);
                let root = std::path::absolute(&root)
                    .map_err(|e| format!("cannot resolve {}: {e}", root.display()))?;
                (root, false)
            }
            None => {
                let n = NEXT_TEMPORARY.fetch_add(1, Ordering::Relaxed);
                let name = format!("flowrl-exec-images-{}-{n}", std::process::id());
                (std::env::temp_dir().join(name), true)
            }
        };
        Ok(ImageFolder {
            root,
            temporary,
            keep,
            cleared: false,
            step: None,
        })
    }

    /// Prepares a request of `step` (0-based): the first of a step gets a fresh folder (and,
    /// unless `keep`, the previous step's folder is removed); a further one continues the step's
    /// folder and numbering.
    pub fn begin(&mut self, step: u64) -> Result<(), String> {
        if let Some(s) = self.step.as_mut().filter(|s| s.step == step) {
            s.prompt_batches.clear();
            s.rollout_batches.clear();
            return Ok(());
        }
        let previous = self.step.take();
        if !self.keep {
            if let Some(p) = previous {
                remove_dir(&p.dir)?;
            }
            if !self.cleared {
                self.clear_earlier_runs()?;
            }
        }
        self.cleared = true;
        let dir = self.root.join(format!("step_{step:06}"));
        // A folder of this name was left by an earlier run: its pictures are not this step's.
        remove_dir(&dir)?;
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        self.step = Some(StepFolder {
            step,
            dir,
            prompt_batches: Vec::new(),
            next_prompt: 0,
            rollout_batches: Vec::new(),
            next_response: 0,
        });
        Ok(())
    }

    /// Removes the `step_*` folders under the root.
    fn clear_earlier_runs(&self) -> Result<(), String> {
        let Ok(entries) = std::fs::read_dir(&self.root) else {
            return Ok(()); // no folder yet
        };
        for e in entries.flatten() {
            if e.file_name().to_string_lossy().starts_with("step_") {
                remove_dir(&e.path())?;
            }
        }
        Ok(())
    }

    /// The paths of the pictures of prompt `i` of `batch`, written on first use in the step.
    /// A prompt the batch does not have has none.
    pub fn prompt(&mut self, batch: &PromptBatch, i: usize) -> Result<Vec<String>, String> {
        let s = self.step.as_mut().ok_or("no step begun")?;
        let first = number(
            &mut s.prompt_batches,
            &mut s.next_prompt,
            batch,
            batch.prompts.len(),
        );
        let Some(p) = batch.prompts.get(i) else {
            return Ok(Vec::new());
        };
        p.pictures
            .iter()
            .enumerate()
            .map(|(k, pic)| save(&s.dir, &format!("prompt{}_image{k}.png", first + i), pic))
            .collect()
    }

    /// The paths of the pictures tools returned to response `r` of `batch` (none for a
    /// single-turn rollout), written on first use in the step.
    pub fn tool(&mut self, batch: &RolloutBatch, r: usize) -> Result<Vec<String>, String> {
        let s = self.step.as_mut().ok_or("no step begun")?;
        let first = number(
            &mut s.rollout_batches,
            &mut s.next_response,
            batch,
            batch.len(),
        );
        let Some(t) = batch.trajectories.get(r) else {
            return Ok(Vec::new());
        };
        t.pictures
            .iter()
            .enumerate()
            .map(|(k, pic)| {
                let name = format!("response{}_tool_image{k}.png", first + r);
                save(&s.dir, &name, pic)
            })
            .collect()
    }
}

impl Drop for ImageFolder {
    fn drop(&mut self) {
        if self.temporary {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }
}

/// The number of `batch`'s first item in the step, numbering it (`len` items) when new.
fn number<T>(seen: &mut Vec<(usize, usize)>, next: &mut usize, batch: &T, len: usize) -> usize {
    let key = std::ptr::from_ref(batch) as usize;
    if let Some(&(_, first)) = seen.iter().find(|(k, _)| *k == key) {
        return first;
    }
    let first = *next;
    *next += len;
    seen.push((key, first));
    first
}

/// Writes `picture` as the PNG file `dir/name` unless it is there already; its path.
fn save(dir: &Path, name: &str, picture: &RgbImage) -> Result<String, String> {
    let path = dir.join(name);
    if !path.exists() {
        picture
            .save_with_format(&path, image::ImageFormat::Png)
            .map_err(|e| format!("cannot write picture {}: {e}", path.display()))?;
    }
    Ok(path.to_string_lossy().into_owned())
}

fn remove_dir(dir: &Path) -> Result<(), String> {
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(format!("cannot remove {}: {e}", dir.display()))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::values::TokenMatrix;
    use flowrl_datasets::{Prompt, RowRef};
    use std::sync::Arc;

    fn prompts(sizes: &[u32]) -> Arc<PromptBatch> {
        let prompts = sizes
            .iter()
            .enumerate()
            .map(|(i, &s)| Prompt {
                uid: format!("e0-{i}"),
                input_ids: vec![1],
                images: Vec::new(),
                pictures: vec![Arc::new(RgbImage::from_pixel(
                    s,
                    s + 1,
                    image::Rgb([9, 8, 7]),
                ))],
                messages: Vec::new(),
                text: String::new(),
                ground_truth: String::new(),
                data_source: String::new(),
                ability: None,
                extra_info: serde_json::Value::Null,
                source: RowRef {
                    file: "x".into(),
                    row: i,
                },
            })
            .collect();
        Arc::new(PromptBatch {
            prompts,
            pad_token_id: 0,
            image_token_id: None,
            epoch: 0,
        })
    }

    fn rollouts(p: &Arc<PromptBatch>, index: Vec<usize>) -> RolloutBatch {
        let b = index.len();
        RolloutBatch::for_prompts(
            p.clone(),
            index,
            vec![vec![1]; b],
            TokenMatrix::zeros(b, 1),
            TokenMatrix::zeros(b, 1),
            vec![String::new(); b],
            vec![false; b],
        )
    }

    #[test]
    fn pictures_are_written_once_per_step_and_old_steps_are_removed() {
        let run = tempfile::tempdir().unwrap();
        let stale = run.path().join("exec_images/eval/reward/step_000009");
        std::fs::create_dir_all(&stale).unwrap();
        let mut f = ImageFolder::new(Some(run.path()), "eval/reward", false).unwrap();
        let p = prompts(&[4, 6]);
        let r = rollouts(&p, vec![0, 0, 1, 1]);

        f.begin(0).unwrap();
        assert!(!stale.exists(), "an earlier run's step folder is removed");
        let a = f.prompt(&r.prompts, 1).unwrap();
        assert_eq!(a.len(), 1);
        assert!(Path::new(&a[0]).is_absolute());
        assert!(a[0].ends_with("exec_images/eval/reward/step_000000/prompt1_image0.png"));
        let png = image::open(&a[0]).unwrap().to_rgb8();
        assert_eq!(png, *p.prompts[1].pictures[0]);
        assert_eq!(f.prompt(&r.prompts, 1).unwrap(), a, "the same file again");
        assert_eq!(f.tool(&r, 2).unwrap(), Vec::<String>::new());
        assert_eq!(f.prompt(&r.prompts, 7).unwrap(), Vec::<String>::new());

        // A second request of the step (another chunk) continues the numbering.
        let q = prompts(&[5]);
        f.begin(0).unwrap();
        let b = f.prompt(&q, 0).unwrap();
        assert!(b[0].ends_with("step_000000/prompt2_image0.png"), "{b:?}");
        assert!(Path::new(&a[0]).exists());

        f.begin(1).unwrap();
        assert!(
            !Path::new(&a[0]).exists(),
            "the previous step's folder is removed"
        );
        let c = f.prompt(&q, 0).unwrap();
        assert!(c[0].ends_with("step_000001/prompt0_image0.png"), "{c:?}");

        let mut kept = ImageFolder::new(Some(run.path()), "kept", true).unwrap();
        kept.begin(0).unwrap();
        let d = kept.prompt(&p, 0).unwrap();
        kept.begin(1).unwrap();
        assert!(Path::new(&d[0]).exists(), "keep_images keeps every step");
    }

    #[test]
    fn tool_pictures_are_numbered_by_response() {
        use crate::values::trajectory::{Finish, Trajectory};
        let p = prompts(&[4]);
        let mut r = rollouts(&p, vec![0, 0]);
        let tool = |s: u32| Trajectory {
            messages: Vec::new(),
            segments: Vec::new(),
            images: Vec::new(),
            pictures: vec![Arc::new(RgbImage::new(s, s)), Arc::new(RgbImage::new(2, 2))],
            tool_calls: 1,
            tool_errors: 0,
            finish: Finish::Stop,
        };
        r.trajectories = vec![Arc::new(tool(3)), Arc::new(tool(5))];
        let mut f = ImageFolder::new(None, "reward", false).unwrap();
        f.begin(0).unwrap();
        let t = f.tool(&r, 1).unwrap();
        assert!(
            t[0].ends_with("step_000000/response1_tool_image0.png"),
            "{t:?}"
        );
        assert!(
            t[1].ends_with("step_000000/response1_tool_image1.png"),
            "{t:?}"
        );
        assert_eq!(image::open(&t[0]).unwrap().width(), 5);
    }

    #[test]
    fn without_a_run_directory_a_temporary_folder_is_used_and_removed() {
        let mut f = ImageFolder::new(None, "reward", false).unwrap();
        f.begin(3).unwrap();
        let p = prompts(&[4]);
        let a = f.prompt(&p, 0).unwrap();
        assert!(Path::new(&a[0]).exists());
        drop(f);
        assert!(!Path::new(&a[0]).exists());
    }
}
