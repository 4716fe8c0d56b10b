//! Hugging Face checkpoint directories on disk: reading `model.safetensors` or the shards of
//! `model.safetensors.index.json` into a [`Checkpoint`] weight source, and writing tensors back
//! in the `save_pretrained` layout.
//!
//! Reading runs in two stages. First the cheap checks, before any tensor data is read: the
//! index's `weight_map` is parsed, every shard it names must exist, and each shard's header (the
//! 8-byte little-endian length and the JSON it announces, nothing more) must list exactly the
//! tensors the index assigns to that shard, in a supported dtype, with data that fits the file.
//! Then the shards are read one at a time through a memory map: each tensor is converted from its
//! stored bytes straight into the target dtype (no f32 intermediate unless the target is f32)
//! and its mapped pages are released (`madvise(MADV_DONTNEED)`) as soon as it is converted, so
//! the process holds the converted weights plus at most one tensor's worth of mapped file.
//!
//! Writing splits the tensors, sorted by name, into shards as transformers'
//! `split_torch_state_dict_into_shards` does (a new shard starts when the next tensor would push
//! the current one past `max_shard_bytes`; a larger tensor gets a shard of its own) and asks for
//! one shard's tensors at a time, so a streamed save holds the model plus one shard.
//!
//! What this module does not do: names and shapes against the model config are checked by the
//! layers through [`WeightSource`] and reported by [`Checkpoint::finish`].

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail, ensure};
use burn::prelude::*;
use burn::tensor::DType;
use half::{bf16, f16};
use memmap2::{Advice, Mmap, UncheckedAdvice};
use safetensors::Dtype;
use safetensors::tensor::{Metadata, TensorView};

use crate::weights::{
    Init, Precision, WeightSink, WeightSource, WeightVisitor, host_data, normalize_name, zeros_data,
};

/// The index file of a sharded checkpoint.
pub const INDEX_FILE: &str = "model.safetensors.index.json";
/// The file of an unsharded checkpoint.
pub const SINGLE_FILE: &str = "model.safetensors";

/// How many names an error lists before it only counts the rest.
const NAMES_SHOWN: usize = 5;

/// One stored tensor, converted to the checkpoint's target dtype.
struct Stored {
    shape: Vec<usize>,
    data: TensorData,
}

/// Weights read from a Hugging Face directory, already in the target precision.
pub struct Checkpoint<B: Backend> {
    device: B::Device,
    /// Tensors not taken yet, by normalised name.
    tensors: HashMap<String, Stored>,
    missing: Vec<String>,
    misshaped: Vec<String>,
    dir: String,
    precision: Precision,
}

impl<B: Backend> Checkpoint<B> {
    /// Reads `model.safetensors`, or every shard named by `model.safetensors.index.json`, with
    /// every tensor converted to `precision` (stored F32, BF16 and F16 are accepted). The index
    /// and the shard headers are checked against each other before any tensor data is read.
    pub fn open(dir: &Path, device: &B::Device, precision: Precision) -> Result<Self> {
        let shards = plan_shards(dir)?;
        let dtype = precision.dtype();
        let mut tensors = HashMap::new();
        for shard in &shards {
            shard.read_into(&mut tensors, dtype)?;
        }
        Ok(Self {
            device: device.clone(),
            tensors,
            missing: Vec::new(),
            misshaped: Vec::new(),
            dir: dir.display().to_string(),
            precision,
        })
    }

    /// Every missing, mis-shaped or unexpected tensor, in one error.
    pub fn finish(self) -> Result<()> {
        let unexpected: BTreeSet<&String> = self.tensors.keys().collect();
        if self.missing.is_empty() && self.misshaped.is_empty() && unexpected.is_empty() {
            return Ok(());
        }
        let mut msg = format!("checkpoint {} does not match the model config:", self.dir);
        for m in &self.missing {
            msg.push_str(&format!("\n  missing tensor {m}"));
        }
        for m in &self.misshaped {
            msg.push_str(&format!("\n  {m}"));
        }
        for u in unexpected {
            msg.push_str(&format!(
                "\n  unexpected tensor {u} {:?}",
                self.tensors[u].shape
            ));
        }
        bail!(msg)
    }
}

impl<B: Backend> WeightSource<B> for Checkpoint<B> {
    fn device(&self) -> B::Device {
        self.device.clone()
    }

    fn dtype(&self) -> DType {
        self.precision.dtype()
    }

    fn take_data(&mut self, name: &str, shape: &[usize], _init: Init) -> TensorData {
        // Taken tensors leave the map (no second copy in memory); what remains is unexpected.
        match self.tensors.remove(name) {
            None => {
                self.missing.push(format!("{name} {shape:?}"));
                zeros_data(shape, self.precision.dtype())
            }
            Some(stored) if stored.shape != shape => {
                self.misshaped.push(format!(
                    "mis-shaped tensor {name}: checkpoint {:?}, config expects {shape:?}",
                    stored.shape
                ));
                zeros_data(shape, self.precision.dtype())
            }
            Some(stored) => stored.data,
        }
    }

    /// A missing or mis-shaped tensor is recorded (as [`WeightSource::take_data`] does) and built
    /// as a placeholder: the load fails at [`Checkpoint::finish`], and a config that claims a
    /// tensor of 2^40 elements must not allocate its zeros first. Once a problem is recorded,
    /// [`WeightSource::placeholders`] is true, so wrappers that do not delegate this method
    /// allocate nothing after the first problem either.
    fn placeholder(&mut self, name: &str, shape: &[usize]) -> bool {
        match self.tensors.get(name) {
            None => {
                self.missing.push(format!("{name} {shape:?}"));
                true
            }
            Some(stored) if stored.shape != shape => {
                self.misshaped.push(format!(
                    "mis-shaped tensor {name}: checkpoint {:?}, config expects {shape:?}",
                    stored.shape
                ));
                self.tensors.remove(name);
                true
            }
            Some(_) => false,
        }
    }

    fn placeholders(&self) -> bool {
        !self.missing.is_empty() || !self.misshaped.is_empty()
    }

    fn ignore(&mut self, name: &str) {
        self.tensors.remove(name);
    }
}

/// One safetensors file whose header has been read and checked.
struct Shard {
    path: PathBuf,
    /// File length in bytes when the header was read.
    file_len: u64,
    /// Offset of the tensor data: 8 + the header length.
    data_start: usize,
    metadata: Metadata,
}

/// The shards of `dir` with their checked headers: the single file, or the index's shards after
/// the cheap checks of the module doc (all problems reported in one error).
fn plan_shards(dir: &Path) -> Result<Vec<Shard>> {
    let index = dir.join(INDEX_FILE);
    let shards = if index.exists() {
        let assigned = read_index(&index)?;
        let mut problems = Vec::new();
        for (file, names) in &assigned {
            let path = dir.join(file);
            if !path.is_file() {
                problems.push(format!(
                    "shard {file} is missing from {} (the index puts {} tensor{} in it)",
                    dir.display(),
                    names.len(),
                    plural(names.len())
                ));
            }
        }
        ensure_none(&index, problems)?;
        let mut shards = Vec::new();
        let mut problems = Vec::new();
        for (file, names) in &assigned {
            let shard = read_header(&dir.join(file))?;
            let stored: BTreeSet<String> = shard.metadata.tensors().into_keys().collect();
            let only_index: Vec<&String> = names.difference(&stored).collect();
            let only_shard: Vec<&String> = stored.difference(names).collect();
            if !only_index.is_empty() || !only_shard.is_empty() {
                let mut msg =
                    format!("shard {file} does not hold the tensors the index assigns to it:");
                if !only_index.is_empty() {
                    msg.push_str(&format!(
                        " {} in the index but not in the shard ({})",
                        only_index.len(),
                        some_names(&only_index)
                    ));
                }
                if !only_shard.is_empty() {
                    if !only_index.is_empty() {
                        msg.push(';');
                    }
                    msg.push_str(&format!(
                        " {} in the shard but not in the index ({})",
                        only_shard.len(),
                        some_names(&only_shard)
                    ));
                }
                problems.push(msg);
            }
            shards.push(shard);
        }
        ensure_none(&index, problems)?;
        shards
    } else {
        let single = dir.join(SINGLE_FILE);
        ensure!(
            single.exists(),
            "{} has neither {SINGLE_FILE} nor {INDEX_FILE}",
            dir.display()
        );
        vec![read_header(&single)?]
    };
    // Two stored names that normalise to one (`model.visual.x` and `visual.x`) would shadow each
    // other.
    let mut seen: HashMap<String, (String, &Path)> = HashMap::new();
    let mut twice = Vec::new();
    for shard in &shards {
        for name in shard.metadata.offset_keys() {
            let key = normalize_name(&name);
            if let Some((first, path)) = seen.get(&key) {
                twice.push(format!(
                    "tensor {key} is stored twice: as {first} in {} and as {name} in {}",
                    path.display(),
                    shard.path.display()
                ));
            } else {
                seen.insert(key, (name, &shard.path));
            }
        }
    }
    ensure_none(dir, twice)?;
    Ok(shards)
}

/// File → tensor names of an index's `weight_map`.
fn read_index(index: &Path) -> Result<BTreeMap<String, BTreeSet<String>>> {
    let text =
        std::fs::read_to_string(index).with_context(|| format!("reading {}", index.display()))?;
    let json: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", index.display()))?;
    let map = match json.get("weight_map") {
        Some(serde_json::Value::Object(map)) => map,
        Some(other) => bail!(
            "{}: `weight_map` is not an object (tensor name → shard file) but {}",
            index.display(),
            json_kind(other)
        ),
        None => bail!("{} has no `weight_map`", index.display()),
    };
    let mut assigned: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (tensor, file) in map {
        let file = file.as_str().with_context(|| {
            format!(
                "{}: weight_map[{tensor}] is not a string but {}",
                index.display(),
                json_kind(file)
            )
        })?;
        ensure!(
            Path::new(file).file_name().is_some_and(|f| f == file),
            "{}: weight_map[{tensor}] = {file:?} is not a file name in the checkpoint directory",
            index.display()
        );
        assigned
            .entry(file.to_string())
            .or_default()
            .insert(tensor.clone());
    }
    Ok(assigned)
}

/// Reads and checks the header of the safetensors file `path`, and nothing else: the header
/// length is bounded by the file size before anything is allocated for it, the tensors must be
/// F32, BF16 or F16 and their data must end exactly at the end of the file.
fn read_header(path: &Path) -> Result<Shard> {
    let mut file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let file_len = file
        .metadata()
        .with_context(|| format!("reading the size of {}", path.display()))?
        .len();
    ensure!(
        file_len >= 8,
        "{}: {file_len} bytes, too short for a safetensors file (it starts with an 8-byte header length)",
        path.display()
    );
    let mut len = [0u8; 8];
    file.read_exact(&mut len)
        .with_context(|| format!("reading {}", path.display()))?;
    let n = u64::from_le_bytes(len);
    ensure!(
        n <= file_len - 8,
        "{}: the header length says {n} bytes but the file holds only {file_len} (truncated, or not a safetensors file)",
        path.display()
    );
    let mut header = vec![0u8; n as usize];
    file.read_exact(&mut header)
        .with_context(|| format!("reading the header of {}", path.display()))?;
    let metadata: Metadata = serde_json::from_slice(&header)
        .with_context(|| format!("parsing the safetensors header of {}", path.display()))?;
    let data_len = metadata.data_len() as u64;
    let held = file_len - 8 - n;
    ensure!(
        held >= data_len,
        "{} is truncated: its header describes {data_len} bytes of tensor data but the file holds {held} after the header",
        path.display()
    );
    ensure!(
        held == data_len,
        "{}: {} bytes follow the last tensor its header describes (not a safetensors file)",
        path.display(),
        held - data_len
    );
    let unsupported: Vec<String> = metadata
        .offset_keys()
        .into_iter()
        .filter_map(|name| {
            let dtype = metadata.info(&name)?.dtype;
            (!matches!(dtype, Dtype::F32 | Dtype::BF16 | Dtype::F16))
                .then(|| format!("{name} ({dtype:?})"))
        })
        .collect();
    ensure!(
        unsupported.is_empty(),
        "{}: tensors of unsupported dtypes (expected F32, BF16 or F16): {}",
        path.display(),
        some_names(&unsupported)
    );
    Ok(Shard {
        path: path.to_path_buf(),
        file_len,
        data_start: 8 + n as usize,
        metadata,
    })
}

impl Shard {
    /// Converts every tensor of the shard into `dtype` and inserts it under its normalised name.
    /// The file is memory-mapped; each tensor's pages are released once it is converted and the
    /// map is dropped at the end.
    fn read_into(&self, tensors: &mut HashMap<String, Stored>, dtype: DType) -> Result<()> {
        let path = self.path.display();
        let file = File::open(&self.path).with_context(|| format!("opening {path}"))?;
        // SAFETY: the map is only read, and only while this function runs. As with every
        // memory-mapped loader (safetensors, candle), the file must not be truncated or rewritten
        // while it is read; its length is checked against the header below.
        let map = unsafe { Mmap::map(&file) }.with_context(|| format!("mapping {path}"))?;
        ensure!(
            map.len() as u64 == self.file_len,
            "{path} changed size while it was being loaded"
        );
        // Read-ahead for a front-to-back pass; only a hint.
        let _ = map.advise(Advice::Sequential);
        for name in self.metadata.offset_keys() {
            let info = self
                .metadata
                .info(&name)
                .expect("offset_keys lists the header's tensors");
            let (start, end) = info.data_offsets;
            let (start, end) = (self.data_start + start, self.data_start + end);
            let bytes = &map[start..end];
            if let Some(k) = first_nan(bytes, info.dtype) {
                bail!(
                    "{path}: tensor {name} holds NaN at flat index {k}: the checkpoint is corrupt \
                     or was saved after training diverged"
                );
            }
            let data = convert(bytes, info.dtype, &info.shape, dtype)
                .with_context(|| format!("{path}: tensor {name}"))?;
            // SAFETY: MADV_DONTNEED on a read-only shared file mapping only drops these pages
            // from the process (reading them again would fault them back in from the file); the
            // bytes of this tensor are not read again.
            let _ = unsafe {
                map.unchecked_advise_range(UncheckedAdvice::DontNeed, start, end - start)
            };
            tensors.insert(
                normalize_name(&name),
                Stored {
                    shape: info.shape.clone(),
                    data,
                },
            );
        }
        Ok(())
    }
}

/// The flat index of the first NaN among little-endian `bytes` of `dtype` (all exponent bits
/// set and a non-zero mantissa), scanned in parallel chunks. Infinities are legitimate weights
/// (Gemma 4's unbounded clip limits are ±inf).
fn first_nan(bytes: &[u8], dtype: Dtype) -> Option<usize> {
    use rayon::prelude::*;
    let (width, exponent, mantissa): (usize, u32, u32) = match dtype {
        Dtype::F32 => (4, 0x7F80_0000, 0x007F_FFFF),
        Dtype::BF16 => (2, 0x7F80, 0x007F),
        Dtype::F16 => (2, 0x7C00, 0x03FF),
        _ => return None,
    };
    let value = |c: &[u8]| {
        if width == 4 {
            u32::from_le_bytes([c[0], c[1], c[2], c[3]])
        } else {
            u32::from(u16::from_le_bytes([c[0], c[1]]))
        }
    };
    const CHUNK: usize = 1 << 20;
    bytes
        .par_chunks(CHUNK * width)
        .enumerate()
        .find_map_first(|(k, chunk)| {
            chunk
                .chunks_exact(width)
                .position(|c| {
                    let v = value(c);
                    v & exponent == exponent && v & mantissa != 0
                })
                .map(|i| k * CHUNK + i)
        })
}

/// Little-endian `bytes` of a tensor stored as `stored` with `shape`, as host data of `target`.
/// A tensor already in the target dtype is copied as is (one `memcpy` on little-endian hosts); BF16/F16 → F32 widens exactly;
/// anything → BF16/F16 rounds to nearest even (`half`'s `from_f32`, as torch's `.to()`).
fn convert(bytes: &[u8], stored: Dtype, shape: &[usize], target: DType) -> Result<TensorData> {
    let f32s = || {
        bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
    };
    let bf16s = || {
        bytes
            .chunks_exact(2)
            .map(|c| bf16::from_le_bytes([c[0], c[1]]))
    };
    let f16s = || {
        bytes
            .chunks_exact(2)
            .map(|c| f16::from_le_bytes([c[0], c[1]]))
    };
    let same = matches!(
        (stored, target),
        (Dtype::F32, DType::F32) | (Dtype::BF16, DType::BF16) | (Dtype::F16, DType::F16)
    );
    Ok(match (stored, target) {
        // The stored little-endian bytes are the host's representation: one copy.
        _ if same && cfg!(target_endian = "little") => {
            TensorData::from_bytes_vec(bytes.to_vec(), shape, target)
        }
        (Dtype::BF16, DType::BF16) => TensorData::new(bf16s().collect::<Vec<_>>(), shape),
        (Dtype::F16, DType::F16) => TensorData::new(f16s().collect::<Vec<_>>(), shape),
        (Dtype::F32, _) => host_data(f32s(), shape, target),
        (Dtype::BF16, _) => host_data(bf16s().map(bf16::to_f32), shape, target),
        (Dtype::F16, _) => host_data(f16s().map(f16::to_f32), shape, target),
        (other, _) => bail!("unsupported dtype {other:?} (expected F32, BF16 or F16)"),
    })
}

/// A stored tensor's values as f32 (stored F32, BF16 or F16; widened exactly).
pub(crate) fn host_f32(view: &TensorView<'_>) -> Result<Vec<f32>> {
    let data = view.data();
    Ok(match view.dtype() {
        Dtype::F32 => data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        Dtype::BF16 => data
            .chunks_exact(2)
            .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        Dtype::F16 => data
            .chunks_exact(2)
            .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        other => bail!("unsupported dtype {other:?} (expected F32, BF16 or F16)"),
    })
}

/// The safetensors dtype a tensor of `dtype` is written as (F32, BF16 or F16).
fn saved_dtype(dtype: DType) -> Result<Dtype> {
    Ok(match dtype {
        DType::F32 => Dtype::F32,
        DType::BF16 => Dtype::BF16,
        DType::F16 => Dtype::F16,
        other => bail!("cannot save a tensor of dtype {other:?} (F32, BF16 or F16 only)"),
    })
}

/// Writes tensors into `dir` in the `save_pretrained` layout: `model.safetensors`, or, when
/// their bytes (`sizes`: name → bytes as saved) exceed `max_shard_bytes`, shards
/// `model-0000k-of-0000n.safetensors` plus `model.safetensors.index.json` with
/// `metadata.total_size` (a stale index is removed when the result is one file).
/// `tensors_of(names)` returns the tensors of one shard (F32, BF16 or F16), called once per shard
/// in order, so only one shard's host data needs to exist at a time.
pub(crate) fn write_checkpoint(
    dir: &Path,
    sizes: &BTreeMap<String, usize>,
    max_shard_bytes: Option<usize>,
    mut tensors_of: impl FnMut(&BTreeSet<String>) -> Result<Vec<(String, TensorData)>>,
) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let limit = max_shard_bytes.unwrap_or(usize::MAX);
    let mut shards: Vec<BTreeSet<String>> = vec![BTreeSet::new()];
    let mut size = 0usize;
    for (name, &bytes) in sizes {
        if size > 0 && size.saturating_add(bytes) > limit {
            shards.push(BTreeSet::new());
            size = 0;
        }
        shards.last_mut().expect("one shard").insert(name.clone());
        size += bytes;
    }
    let n = shards.len();
    let mut weight_map = serde_json::Map::new();
    let mut total = 0usize;
    for (k, names) in shards.iter().enumerate() {
        let file = if n == 1 {
            SINGLE_FILE.to_string()
        } else {
            format!("model-{:05}-of-{:05}.safetensors", k + 1, n)
        };
        let tensors = tensors_of(names)?;
        let got: BTreeSet<&String> = tensors.iter().map(|(name, _)| name).collect();
        ensure!(
            got.len() == names.len() && names.iter().all(|name| got.contains(name)),
            "shard {file}: expected {} tensors, got {}",
            names.len(),
            got.len()
        );
        let views: Vec<(String, TensorView<'_>)> = tensors
            .iter()
            .map(|(name, data)| {
                total += data.as_bytes().len();
                weight_map.insert(name.clone(), serde_json::Value::String(file.clone()));
                let view = TensorView::new(
                    saved_dtype(data.dtype)?,
                    data.shape.to_vec(),
                    data.as_bytes(),
                )
                .with_context(|| format!("tensor {name}"))?;
                Ok((name.clone(), view))
            })
            .collect::<Result<_>>()?;
        let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
        let path = dir.join(&file);
        safetensors::serialize_to_file(views, Some(meta), &path)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    let index = dir.join(INDEX_FILE);
    if n > 1 {
        let json = serde_json::json!({
            "metadata": { "total_size": total },
            "weight_map": weight_map,
        });
        std::fs::write(&index, serde_json::to_string_pretty(&json)?)
            .with_context(|| format!("writing {}", index.display()))?;
    } else if index.exists() {
        std::fs::remove_file(&index)
            .with_context(|| format!("removing stale {}", index.display()))?;
    }
    Ok(())
}

/// Bytes of a tensor of `shape` saved as `dtype`.
/// Byte sizes of a model's tensors as [`WeightSink`] would collect them (converted to
/// `precision`, or each in its own dtype), from shapes and dtypes alone: the plan of a streamed
/// save, which reads no tensor data.
pub(crate) struct SavedSizes {
    precision: Option<Precision>,
    pub sizes: BTreeMap<String, usize>,
}

impl SavedSizes {
    pub fn new(precision: Option<Precision>) -> Self {
        Self {
            precision,
            sizes: BTreeMap::new(),
        }
    }
}

impl<B: Backend> WeightVisitor<B> for SavedSizes {
    fn put<const D: usize>(&mut self, name: &str, t: Tensor<B, D>) {
        let dtype = self.precision.map_or(t.dtype(), Precision::dtype);
        let bytes = saved_bytes(&t.dims(), dtype);
        self.sizes.insert(name.to_string(), bytes);
    }

    fn put_buffer(&mut self, name: &str, shape: &[usize], _values: &[f32]) {
        let dtype = self.precision.map_or(DType::F32, Precision::dtype);
        let bytes = saved_bytes(shape, dtype);
        self.sizes.insert(name.to_string(), bytes);
    }
}

impl WeightSink {
    /// Writes the tensors into `dir` as safetensors, each in the dtype it was collected in (F32,
    /// BF16 or F16): `model.safetensors`, or, when they exceed `max_shard_bytes`, shards
    /// `model-0000k-of-0000n.safetensors` plus `model.safetensors.index.json` (the
    /// `save_pretrained` layout; see [`crate::checkpoint`]).
    pub fn write(&self, dir: &Path, max_shard_bytes: Option<usize>) -> Result<()> {
        let sizes = self
            .tensors()
            .iter()
            .map(|(name, d)| (name.clone(), d.as_bytes().len()))
            .collect();
        write_checkpoint(dir, &sizes, max_shard_bytes, |names| {
            Ok(names
                .iter()
                .map(|name| (name.clone(), self.tensors()[name].clone()))
                .collect())
        })
    }
}

pub(crate) fn saved_bytes(shape: &[usize], dtype: DType) -> usize {
    shape.iter().product::<usize>() * dtype.size()
}

fn ensure_none(path: &Path, problems: Vec<String>) -> Result<()> {
    match problems.len() {
        0 => Ok(()),
        1 => bail!("{}: {}", path.display(), problems[0]),
        _ => bail!("{}:\n  {}", path.display(), problems.join("\n  ")),
    }
}

/// The first few of `names`, then how many more.
fn some_names<S: std::fmt::Display>(names: &[S]) -> String {
    let shown: Vec<String> = names
        .iter()
        .take(NAMES_SHOWN)
        .map(|n| n.to_string())
        .collect();
    let mut out = shown.join(", ");
    if names.len() > NAMES_SHOWN {
        out.push_str(&format!(" and {} more", names.len() - NAMES_SHOWN));
    }
    out
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

fn json_kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}
