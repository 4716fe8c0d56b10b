//! Capability traits: what a model family can do, independent of which family it is.
//!
//! Nodes and the engine ask a loaded [`crate::Model`] for capabilities
//! (`causal_lm()`, `vision()`, `multimodal_positions()`) and never for a family name. A family
//! implements the traits it supports; the family registry ([`crate::registry`]) picks the family
//! once, from `config.json`'s `model_type`.
//!
//! Host-side data (token ids, masks, position ids, processed images) are plain Rust values so that
//! they can travel on graph edges; tensors are created on a device only inside the model calls.
//!
//! This module deliberately holds no model code: only the contracts and the small helpers every
//! family shares (plain 1-D positions, scattering image embeddings into the token stream).

use std::ops::Range;

use anyhow::{Result, bail, ensure};
use burn::prelude::*;

// ---------------------------------------------------------------------------------------------
// Image processor capability
// ---------------------------------------------------------------------------------------------

/// What one picture becomes for a model (the image-processor capability's output).
#[derive(Debug, Clone, PartialEq)]
pub struct ProcessedImage {
    /// Row-major values of shape `shape` (Qwen: `[num_patches, 3*2*14*14]`).
    pub pixel_values: Vec<f32>,
    /// Shape of `pixel_values`.
    pub shape: Vec<usize>,
    /// Family meaning (Qwen: `[t, gh, gw]` in patches).
    pub grid: Vec<usize>,
    /// Number of image tokens it becomes in the prompt.
    pub num_tokens: usize,
    /// Per row of `pixel_values`, the patch's `(x, y)` = (column, row) in the patch grid and
    /// `(-1, -1)` on padding rows; `None` where the layout follows from `grid` alone (Qwen).
    /// Gemma 4: `max_patches` entries (the vision tower's `pixel_position_ids`).
    pub patch_positions: Option<Vec<[i64; 2]>>,
    /// `Some` when the input is a video ([`VideoProcessor`]): its frames' timing. Its tokens in
    /// the prompt are then the vision tower's video token ([`Vision::video_token_id`]).
    pub video: Option<VideoTiming>,
}

/// The timing of a processed video (Qwen: `grid[0]` temporal patches of `temporal_patch_size`
/// frames each).
#[derive(Debug, Clone, PartialEq)]
pub struct VideoTiming {
    /// Seconds one temporal patch spans: `temporal_patch_size / fps` of the processed frames
    /// (transformers' `second_per_grid_ts`).
    pub second_per_grid_t: f32,
    /// Per temporal patch, its time in seconds: the mean of its first and last frame's time
    /// (transformers Qwen3-VL `_calculate_timestamps`).
    pub patch_seconds: Vec<f64>,
}

/// Turns pictures into model inputs and tells how the prompt's image placeholder expands.
pub trait ImageProcessor: Send + Sync {
    /// Resize, normalise and lay out one picture.
    fn process(&self, image: &image::RgbImage) -> Result<ProcessedImage>;
    /// Token string the model's chat template emits for one image (Qwen: `"<|image_pad|>"`).
    fn placeholder_token(&self) -> &str;
    /// Replace each placeholder token id in `ids`, in order, by the ids image k becomes.
    fn expand_placeholders(&self, ids: &[u32], images: &[ProcessedImage]) -> Result<Vec<u32>>;
    /// The family's video processor, when it takes videos.
    fn video(&self) -> Option<&dyn VideoProcessor> {
        None
    }
}

/// A video as the dataset gives it: decoded frames in time order and their timing.
#[derive(Debug, Clone, PartialEq)]
pub struct VideoFrames {
    pub frames: Vec<image::RgbImage>,
    /// Frame rate of `frames` (after any sampling), frames per second.
    pub fps: f64,
    /// Index of each frame in the source video at `source_fps` (`0..n` for a frame list).
    pub frame_indices: Vec<usize>,
    /// Frame rate of the source the indices count in (`fps` for a frame list).
    pub source_fps: f64,
}

impl VideoFrames {
    /// A frame list at `fps`: every frame kept, indices `0..n`.
    pub fn from_list(frames: Vec<image::RgbImage>, fps: f64) -> Self {
        let frame_indices = (0..frames.len()).collect();
        Self {
            frames,
            fps,
            frame_indices,
            source_fps: fps,
        }
    }
}

/// Turns videos into model inputs (the video-processor capability). A video becomes one
/// [`ProcessedImage`] with [`ProcessedImage::video`] set; the vision tower takes it like a
/// picture.
///
/// Placeholders are expanded in the rendered prompt *text*, before tokenization (as
/// transformers' processors do): the k-th occurrence of [`Self::placeholder_text`] becomes
/// [`Self::expanded_text`] of video k. (Qwen3-VL writes frame timestamps between the frames, so a
/// token-level expansion would need the tokenizer.)
pub trait VideoProcessor: Send + Sync {
    /// Resize, normalise and lay out one video.
    fn process_video(&self, video: &VideoFrames) -> Result<ProcessedImage>;
    /// The text the chat template writes for one video (Qwen2-VL: `"<|video_pad|>"`).
    fn placeholder_text(&self) -> &str;
    /// The text that replaces one placeholder of `video`.
    fn expanded_text(&self, video: &ProcessedImage) -> Result<String>;
}

// ---------------------------------------------------------------------------------------------
// Token batches and position ids (host side)
// ---------------------------------------------------------------------------------------------

/// A left-padded batch of token rows, row-major `[batch, len]`.
#[derive(Debug, Clone, PartialEq)]
pub struct PaddedBatch {
    /// Token ids, `batch * len` values; padding positions hold the pad id.
    pub ids: Vec<u32>,
    /// 1 = real token, 0 = padding (padding is at the start of a row). A row that packs
    /// several sequences one after the other (padding-free layouts) numbers their tokens 1, 2,
    /// …: attention stays inside a sequence ([`crate::layers::causal_padding_bias`]); position
    /// ids are then the caller's, not computed from this mask.
    pub attention_mask: Vec<u32>,
    pub batch: usize,
    pub len: usize,
}

impl PaddedBatch {
    /// Left-pads `rows` with `pad_id` to the longest row.
    pub fn left_pad(rows: &[Vec<u32>], pad_id: u32) -> Self {
        let len = rows.iter().map(Vec::len).max().unwrap_or(0);
        Self::left_pad_to(rows, pad_id, len)
    }

    /// Left-pads `rows` with `pad_id` to `len` tokens (at least the longest row's length).
    pub fn left_pad_to(rows: &[Vec<u32>], pad_id: u32, len: usize) -> Self {
        let longest = rows.iter().map(Vec::len).max().unwrap_or(0);
        assert!(longest <= len, "a row of {longest} tokens padded to {len}");
        let mut ids = Vec::with_capacity(rows.len() * len);
        let mut attention_mask = Vec::with_capacity(rows.len() * len);
        for row in rows {
            let pad = len - row.len();
            ids.extend(std::iter::repeat_n(pad_id, pad));
            ids.extend_from_slice(row);
            attention_mask.extend(std::iter::repeat_n(0, pad));
            attention_mask.extend(std::iter::repeat_n(1, row.len()));
        }
        Self {
            ids,
            attention_mask,
            batch: rows.len(),
            len,
        }
    }

    /// Checks that the vectors have `batch * len` values.
    pub fn validate(&self) -> Result<()> {
        let n = self.batch * self.len;
        ensure!(
            self.ids.len() == n && self.attention_mask.len() == n,
            "padded batch {}x{} has {} ids and {} mask values",
            self.batch,
            self.len,
            self.ids.len(),
            self.attention_mask.len()
        );
        Ok(())
    }

    /// Ids of row `b` (padding included).
    pub fn row(&self, b: usize) -> &[u32] {
        &self.ids[b * self.len..(b + 1) * self.len]
    }

    /// Attention mask of row `b`.
    pub fn mask_row(&self, b: usize) -> &[u32] {
        &self.attention_mask[b * self.len..(b + 1) * self.len]
    }

    /// Number of real tokens per row.
    pub fn real_lengths(&self) -> Vec<usize> {
        (0..self.batch)
            .map(|b| self.mask_row(b).iter().filter(|&&m| m != 0).count())
            .collect()
    }

    /// `[batch, len]` int tensor of the ids.
    pub fn ids_tensor<B: Backend>(&self, device: &B::Device) -> Tensor<B, 2, Int> {
        let v: Vec<i64> = self.ids.iter().map(|&x| x as i64).collect();
        Tensor::<B, 1, Int>::from_data(TensorData::new(v, [self.ids.len()]), device)
            .reshape([self.batch, self.len])
    }

    /// `[batch, len]` int tensor of the attention mask.
    pub fn mask_tensor<B: Backend>(&self, device: &B::Device) -> Tensor<B, 2, Int> {
        mask_tensor(&self.attention_mask, self.batch, self.len, device)
    }
}

/// `[batch, len]` int tensor from a row-major 0/1 mask.
pub fn mask_tensor<B: Backend>(
    mask: &[u32],
    batch: usize,
    len: usize,
    device: &B::Device,
) -> Tensor<B, 2, Int> {
    let v: Vec<i64> = mask.iter().map(|&x| x as i64).collect();
    Tensor::<B, 1, Int>::from_data(TensorData::new(v, [mask.len()]), device).reshape([batch, len])
}

/// Rotary position ids of a batch: `streams` position streams (3 for multimodal RoPE, 1 for plain
/// RoPE), row-major `[streams, batch, len]`, plus the per-row delta used when decoding.
#[derive(Debug, Clone, PartialEq)]
pub struct PositionIds {
    pub streams: usize,
    pub batch: usize,
    pub len: usize,
    /// `streams * batch * len` positions; 0 at padding positions.
    pub ids: Vec<i64>,
    /// Per row: `max position of the row + 1 − number of real tokens` (0 for plain positions).
    pub rope_deltas: Vec<i64>,
}

impl PositionIds {
    /// `[streams, batch, len]` int tensor.
    pub fn tensor<B: Backend>(&self, device: &B::Device) -> Tensor<B, 3, Int> {
        Tensor::<B, 1, Int>::from_data(TensorData::new(self.ids.clone(), [self.ids.len()]), device)
            .reshape([self.streams, self.batch, self.len])
    }

    /// Positions of the next single token of each row during decoding, given how many real
    /// tokens (prompt + already generated) row b holds before it: `real_b + rope_deltas[b]` on
    /// every stream (HF Qwen2-VL `get_rope_index` continuation; plain RoPE has delta 0).
    pub fn decode_step(&self, real_lengths: &[usize]) -> PositionIds {
        let mut ids = Vec::with_capacity(self.streams * self.batch);
        for _ in 0..self.streams {
            for (b, &n) in real_lengths.iter().enumerate() {
                ids.push(n as i64 + self.rope_deltas[b]);
            }
        }
        PositionIds {
            streams: self.streams,
            batch: self.batch,
            len: 1,
            ids,
            rope_deltas: self.rope_deltas.clone(),
        }
    }
}

/// Plain 1-D positions from the attention mask, for families without multimodal RoPE:
/// `position = cumsum(mask) − 1` at real tokens, 0 at padding, delta 0.
pub fn plain_positions(batch: &PaddedBatch) -> PositionIds {
    let mut ids = Vec::with_capacity(batch.batch * batch.len);
    for b in 0..batch.batch {
        let mut cur = 0i64;
        for &m in batch.mask_row(b) {
            if m != 0 {
                ids.push(cur);
                cur += 1;
            } else {
                ids.push(0);
            }
        }
    }
    PositionIds {
        streams: 1,
        batch: batch.batch,
        len: batch.len,
        ids,
        rope_deltas: vec![0; batch.batch],
    }
}

/// Position-id capability of models with multimodal RoPE (Qwen2-VL: three streams T/H/W).
/// Models without it use [`plain_positions`].
pub trait MultimodalPositions: Send + Sync {
    /// Position ids and rope deltas of a left-padded prompt batch whose image placeholders are
    /// already expanded; `images` are in prompt order (row-major over the batch).
    fn position_ids(&self, batch: &PaddedBatch, images: &[ProcessedImage]) -> Result<PositionIds>;
}

// ---------------------------------------------------------------------------------------------
// Causal LM and vision capabilities (device side)
// ---------------------------------------------------------------------------------------------

/// Per-layer key/value cache for incremental decoding. Keys and values are stored after RoPE,
/// `[batch, kv_heads, cached_len, head_dim]`.
#[derive(Debug, Clone)]
pub struct KvCache<B: Backend> {
    pub(crate) layers: Vec<Option<(Tensor<B, 4>, Tensor<B, 4>)>>,
}

impl<B: Backend> KvCache<B> {
    /// An empty cache for `num_layers` decoder layers.
    pub fn new(num_layers: usize) -> Self {
        Self {
            layers: vec![None; num_layers],
        }
    }

    /// Number of cached positions (0 when empty).
    pub fn len(&self) -> usize {
        self.layers
            .first()
            .and_then(|l| l.as_ref())
            .map(|(k, _)| k.dims()[2])
            .unwrap_or(0)
    }

    /// True when nothing is cached yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The caches of several batches of one length, one after the other along the batch.
    pub fn concat(mut caches: Vec<KvCache<B>>) -> Self {
        if caches.len() == 1 {
            return caches.remove(0);
        }
        let layers = caches.first().map_or(0, |c| c.layers.len());
        let mut out = KvCache::new(layers);
        for (i, slot) in out.layers.iter_mut().enumerate() {
            let parts: Vec<(Tensor<B, 4>, Tensor<B, 4>)> = caches
                .iter_mut()
                .filter_map(|c| c.layers[i].take())
                .collect();
            if parts.is_empty() {
                continue;
            }
            let (ks, vs): (Vec<_>, Vec<_>) = parts.into_iter().unzip();
            *slot = Some((Tensor::cat(ks, 0), Tensor::cat(vs, 0)));
        }
        out
    }

    /// Keeps only the given batch rows (e.g. to drop finished sequences).
    pub fn select_rows(&mut self, rows: &[usize]) {
        for (k, v) in self.layers.iter_mut().flatten() {
            let device = k.device();
            let idx = Tensor::<B, 1, Int>::from_data(
                TensorData::new(rows.iter().map(|&r| r as i64).collect(), [rows.len()]),
                &device,
            );
            *k = k.clone().select(0, idx.clone());
            *v = v.clone().select(0, idx);
        }
    }
}

/// A decoder-only language model: embeddings in, hidden states out; the LM head is separate so
/// callers can project only the positions they need (e.g. response tokens, in chunks).
pub trait CausalLm<B: Backend> {
    /// Token embeddings `[batch, len, hidden]` of `ids` `[batch, len]`.
    fn embed_tokens(&self, ids: Tensor<B, 2, Int>) -> Tensor<B, 3>;

    /// Runs the decoder over `embeds` `[batch, len, hidden]` at `positions`
    /// `[streams, batch, len]` and returns the final-normed hidden states `[batch, len, hidden]`.
    /// Families whose vision tower gives layer inputs accept `embeds` of `(1 + K) · hidden`
    /// channels (see [`Vision::embed_images`]).
    ///
    /// `ids` `[batch, len]` are the token ids `embeds` were made from (image placeholder ids
    /// included, even where image embeddings replaced their rows): families with token-identity
    /// inputs inside the decoder (Gemma 4's per-layer embeddings) read them; others ignore them.
    ///
    /// `attention_mask` `[batch, cached + len]` covers every key: the cached ones first, then the
    /// new ones (1 = attend, 0 = padding; 1, 2, … for the sequences of a packed row, which do not
    /// attend to each other); attention is also causal. With a cache, the new keys and values are
    /// appended to it.
    fn forward_hidden(
        &self,
        ids: Tensor<B, 2, Int>,
        embeds: Tensor<B, 3>,
        positions: Tensor<B, 3, Int>,
        attention_mask: Tensor<B, 2, Int>,
        cache: Option<&mut KvCache<B>>,
    ) -> Tensor<B, 3>;

    /// Logits `[batch, len, vocab]` of final-normed hidden states.
    fn lm_head(&self, hidden: Tensor<B, 3>) -> Tensor<B, 3>;

    /// The decoder's layers grouped into segments that [`CausalLm::decoder_segment`] runs on
    /// their own, in order and covering every layer: one layer each, except where layers share
    /// state besides the residual stream (Gemma 4's KV-sharing layers form one segment with the
    /// layers whose keys and values they read). Gradient checkpointing keeps the residual
    /// stream at these boundaries and recomputes one segment at a time in the backward.
    fn decoder_segments(&self) -> Vec<Range<usize>>;

    /// The residual stream entering the first layer and the layer inputs, from the input
    /// embeddings of [`CausalLm::forward_hidden`] (and its `ids`).
    fn decoder_inputs(&self, ids: Tensor<B, 2, Int>, embeds: Tensor<B, 3>) -> DecoderInputs<B>;

    /// The channels of [`DecoderInputs::layer_inputs`] that `layers` read (those of a batch
    /// with fewer channels are clamped to its width; empty when the layers read none).
    fn layer_input_channels(&self, layers: Range<usize>) -> Range<usize>;

    /// Runs `layers` (one of [`CausalLm::decoder_segments`]) over the residual stream `h`
    /// `[batch, len, hidden]` without a cache, with `layer_inputs` the channels
    /// [`CausalLm::layer_input_channels`] of [`DecoderInputs::layer_inputs`] (`None` when there
    /// are none); `positions` and `attention_mask` as in [`CausalLm::forward_hidden`]. Returns
    /// the stream after the last of them.
    ///
    /// Without a cache, `forward_hidden` is [`CausalLm::decoder_inputs`], then every segment
    /// in order, then [`CausalLm::final_norm`].
    fn decoder_segment(
        &self,
        layers: Range<usize>,
        h: Tensor<B, 3>,
        layer_inputs: Option<Tensor<B, 3>>,
        positions: Tensor<B, 3, Int>,
        attention_mask: Tensor<B, 2, Int>,
    ) -> Tensor<B, 3>;

    /// The final norm over the residual stream after the last layer.
    fn final_norm(&self, h: Tensor<B, 3>) -> Tensor<B, 3>;

    /// An empty KV cache sized for this model.
    fn new_cache(&self) -> KvCache<B>;

    /// Bytes of KV cache one token takes: over the layers that store keys and values, 2 ×
    /// kv heads × head width × the weights' element size (the cache is in the compute dtype).
    fn kv_cache_bytes_per_token(&self) -> usize;

    fn vocab_size(&self) -> usize;
    /// Token ids that end a generation.
    fn eos_token_ids(&self) -> Vec<u32>;
    /// Maximum sequence length (prompt + response) the model supports.
    fn context_length(&self) -> usize;
    /// Hidden width of the decoder.
    fn hidden_size(&self) -> usize;
}

/// What the decoder's layers read from the input embeddings ([`CausalLm::decoder_inputs`]).
pub struct DecoderInputs<B: Backend> {
    /// `[batch, len, hidden]`: the residual stream entering the first layer.
    pub stream: Tensor<B, 3>,
    /// `[batch, len, channels]`: what the layers read besides the stream, the positions and the
    /// mask, laid out along the channels layer by layer ([`CausalLm::layer_input_channels`]):
    /// Qwen3-VL's DeepStack features, Gemma 4's per-layer inputs. `None` when there are none.
    pub layer_inputs: Option<Tensor<B, 3>>,
}

/// The layer inputs that a segment reads: the channels `wanted`
/// ([`CausalLm::layer_input_channels`]) clamped to the width of `layer_inputs` (a batch may carry
/// fewer: Qwen3-VL's text-only inputs have no DeepStack blocks), and their values (a view;
/// `None` when there are none).
pub fn layer_input_slice<B: Backend>(
    layer_inputs: Option<&Tensor<B, 3>>,
    wanted: Range<usize>,
) -> (Range<usize>, Option<Tensor<B, 3>>) {
    let width = layer_inputs.map_or(0, |t| t.dims()[2]);
    let channels = wanted.start.min(width)..wanted.end.min(width);
    let slice = layer_inputs
        .filter(|_| !channels.is_empty())
        .map(|t| t.clone().narrow(2, channels.start, channels.len()));
    (channels, slice)
}

/// A vision tower: processed images to embeddings in the text model's hidden width.
pub trait Vision<B: Backend> {
    /// The token id whose positions receive image embeddings.
    fn image_token_id(&self) -> u32;

    /// The token id whose positions receive video embeddings, when the tower takes videos.
    fn video_token_id(&self) -> Option<u32> {
        None
    }

    /// Every token id that receives vision embeddings: the image token, then the video token.
    fn vision_token_ids(&self) -> Vec<u32> {
        std::iter::once(self.image_token_id())
            .chain(self.video_token_id())
            .collect()
    }

    /// Embeddings `[Σ num_tokens, hidden · (1 + K)]` of `images` (pictures and videos),
    /// concatenated in order.
    ///
    /// The first `hidden` channels replace the image tokens' input embeddings. K ≥ 0 further
    /// blocks of `hidden` channels are *layer inputs* of towers that also feed the decoder's
    /// first layers (Qwen3-VL's DeepStack: block k is added to the residual stream after
    /// decoder layer k at the image positions). They ride in the input embeddings so that every
    /// caller's path (embed tokens → scatter → `forward_hidden`) carries them unchanged:
    /// [`scatter_image_embeddings`] gives text positions zeros there, and the family's
    /// [`CausalLm::forward_hidden`] splits them off. K = 0 for most families.
    fn embed_images(&self, images: &[ProcessedImage], device: &B::Device) -> Result<Tensor<B, 2>>;
}

/// The input embeddings `[batch, len, hidden·(1 + K)]` of a token batch with its images: the
/// one place that prepares them, for [`crate::Model::input_embeddings`] (log-probs, training
/// sequences, checks), [`crate::Model::input_embeddings_shared`] and generation's prefill
/// ([`crate::generate::generate`]).
///
/// Token embeddings ([`CausalLm::embed_tokens`]) with the image embeddings
/// ([`Vision::embed_images`], DeepStack blocks included) scattered into the vision-token
/// positions ([`scatter_image_embeddings`]). With `first` (see
/// [`crate::Model::input_embeddings_shared`]) the tower runs once per distinct image and the
/// distinct images' rows are gathered into image order (a repeated image gets the same values;
/// in the backward its rows' gradients are summed before the tower's). Without images the
/// token embeddings are returned as they are; callers decide whether vision tokens without
/// images are an error.
pub fn embed_inputs<B: Backend>(
    lm: &dyn CausalLm<B>,
    vision: Option<&dyn Vision<B>>,
    tokens: &PaddedBatch,
    images: &[ProcessedImage],
    first: Option<&[usize]>,
    device: &B::Device,
) -> Result<Tensor<B, 3>> {
    tokens.validate()?;
    let text = lm.embed_tokens(tokens.ids_tensor(device));
    if images.is_empty() {
        return Ok(text);
    }
    let Some(vision) = vision else {
        bail!(
            "the prompts carry {} images but the model has no vision capability",
            images.len()
        );
    };
    let image_embeds = match first {
        Some(first) if first.iter().enumerate().any(|(i, &f)| f != i) => {
            let mut offset = vec![0usize; images.len()];
            let mut distinct = Vec::new();
            let mut next = 0;
            for (i, image) in images.iter().enumerate() {
                if first[i] == i {
                    offset[i] = next;
                    next += image.num_tokens;
                    distinct.push(image.clone());
                }
            }
            let distinct_embeds = vision.embed_images(&distinct, device)?;
            let rows: Vec<i64> = images
                .iter()
                .enumerate()
                .flat_map(|(i, image)| {
                    let o = offset[first[i]];
                    (o..o + image.num_tokens).map(|r| r as i64)
                })
                .collect();
            let n = rows.len();
            let index = Tensor::<B, 1, Int>::from_data(TensorData::new(rows, [n]), device);
            distinct_embeds.select(0, index)
        }
        _ => vision.embed_images(images, device)?,
    };
    scatter_image_embeddings(text, &tokens.ids, &vision.vision_token_ids(), image_embeds)
}

/// Replaces the embeddings at the positions where `ids` holds one of `token_ids` (the vision
/// tokens, [`Vision::vision_token_ids`]; row-major over `[batch, len]`) by the rows of
/// `image_embeds`, in order. Differentiable in both inputs
/// (a `select` over the concatenation `[text rows; image rows]`).
///
/// `image_embeds` may be `(1 + K)` times as wide as `text_embeds` (K layer-input blocks, see
/// [`Vision::embed_images`]): the text rows are then extended with zeros and the result is
/// `[batch, len, (1 + K) · hidden]`.
pub fn scatter_image_embeddings<B: Backend>(
    text_embeds: Tensor<B, 3>,
    ids: &[u32],
    token_ids: &[u32],
    image_embeds: Tensor<B, 2>,
) -> Result<Tensor<B, 3>> {
    let [batch, len, hidden] = text_embeds.dims();
    ensure!(ids.len() == batch * len, "ids do not match the embeddings");
    let [n_image, image_hidden] = image_embeds.dims();
    ensure!(
        image_hidden >= hidden && image_hidden.is_multiple_of(hidden),
        "image embeddings are {image_hidden} wide, text embeddings {hidden}"
    );
    let n_tokens = ids.iter().filter(|t| token_ids.contains(t)).count();
    ensure!(
        n_tokens == n_image,
        "the prompts hold {n_tokens} image tokens but the images give {n_image} embeddings"
    );
    if n_image == 0 {
        return Ok(text_embeds);
    }
    let mut next = batch * len;
    let index: Vec<i64> = ids
        .iter()
        .enumerate()
        .map(|(i, &t)| {
            if token_ids.contains(&t) {
                next += 1;
                (next - 1) as i64
            } else {
                i as i64
            }
        })
        .collect();
    let device = text_embeds.device();
    let index = Tensor::<B, 1, Int>::from_data(TensorData::new(index, [batch * len]), &device);
    let mut text_rows = text_embeds.reshape([batch * len, hidden]);
    if image_hidden > hidden {
        let dtype = text_rows.dtype();
        let zeros = Tensor::zeros([batch * len, image_hidden - hidden], (&device, dtype));
        text_rows = Tensor::cat(vec![text_rows, zeros], 1);
    }
    let rows = Tensor::cat(vec![text_rows, image_embeds], 0);
    Ok(rows.select(0, index).reshape([batch, len, image_hidden]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;

    #[test]
    fn left_pad_and_plain_positions() {
        let b = PaddedBatch::left_pad(&[vec![5, 6, 7], vec![8]], 0);
        assert_eq!(b.ids, vec![5, 6, 7, 0, 0, 8]);
        assert_eq!(b.attention_mask, vec![1, 1, 1, 0, 0, 1]);
        assert_eq!(b.real_lengths(), vec![3, 1]);
        let p = plain_positions(&b);
        assert_eq!(p.ids, vec![0, 1, 2, 0, 0, 0]);
        assert_eq!(p.rope_deltas, vec![0, 0]);
        // The next token of each row continues at its real length.
        assert_eq!(p.decode_step(&[3, 1]).ids, vec![3, 1]);
    }

    #[test]
    fn decode_step_adds_rope_deltas_on_every_stream() {
        let p = PositionIds {
            streams: 3,
            batch: 2,
            len: 1,
            ids: vec![0; 6],
            rope_deltas: vec![-4, 2],
        };
        assert_eq!(p.decode_step(&[22, 10]).ids, vec![18, 12, 18, 12, 18, 12]);
    }

    #[test]
    fn scatter_replaces_image_token_rows_in_order() {
        let device = Default::default();
        let text = Tensor::<Flex, 1>::from_data(
            TensorData::new((0..8).map(|x| x as f32).collect::<Vec<_>>(), [8]),
            &device,
        )
        .reshape([2, 2, 2]);
        let image = Tensor::<Flex, 1>::from_data(
            TensorData::new(vec![100.0f32, 101.0, 200.0, 201.0], [4]),
            &device,
        )
        .reshape([2, 2]);
        let ids = [1, 9, 9, 3];
        let out = scatter_image_embeddings(text.clone(), &ids, &[9], image.clone()).unwrap();
        let v = out.into_data().into_vec::<f32>().unwrap();
        assert_eq!(v, vec![0.0, 1.0, 100.0, 101.0, 200.0, 201.0, 6.0, 7.0]);
        // Image (9) and video (8) tokens take the vision rows in prompt order.
        let out =
            scatter_image_embeddings(text.clone(), &[8, 1, 9, 3], &[9, 8], image.clone()).unwrap();
        let v = out.into_data().into_vec::<f32>().unwrap();
        assert_eq!(v, vec![100.0, 101.0, 2.0, 3.0, 200.0, 201.0, 6.0, 7.0]);
        let wide = Tensor::<Flex, 1>::from_data(
            TensorData::new(vec![100.0f32, 101.0, 102.0, 103.0], [4]),
            &device,
        )
        .reshape([1, 4]);
        let out = scatter_image_embeddings(text.clone(), &[9, 1, 2, 3], &[9], wide).unwrap();
        assert_eq!(out.dims(), [2, 2, 4]);
        let v = out.into_data().into_vec::<f32>().unwrap();
        // The image row keeps its layer-input block; text rows get zeros there.
        assert_eq!(&v[..8], &[100.0, 101.0, 102.0, 103.0, 2.0, 3.0, 0.0, 0.0]);
        let err = scatter_image_embeddings(text, &[9, 1, 1, 1], &[9], image).unwrap_err();
        assert!(
            err.to_string()
                .contains("1 image tokens but the images give 2")
        );
    }
}
