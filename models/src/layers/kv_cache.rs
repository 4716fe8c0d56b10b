//! The KV cache of an attention layer: appending a step's keys and values to a layer's slot
//! ([`append_kv`]), reserving the slot at its final length ([`reserve_kv`]) and writing new
//! positions into it in place ([`write_positions`]).

use burn::prelude::*;

/// Appends a layer's new keys and values `[b, kv_heads, l, d]` to its cache slot and returns
/// the keys and values to attend to, `[b, kv_heads, total, d]` (`total` = cached + `l`, the
/// width of the attention mask). The slot holds either exactly the `total − l` cached
/// positions, grown here by a `cat` (a cache filled by plain forward calls), or buffers
/// reserved at a longer length by [`reserve_kv`] (generation): their first `total − l`
/// positions are filled, the new ones are written in place after them ([`write_positions`])
/// and the filled prefix is returned as a view, so no step copies the cache. Either way the
/// returned values are the same numbers. An empty slot stores `k`, `v` as they are.
pub(crate) fn append_kv<B: Backend>(
    slot: &mut Option<(Tensor<B, 4>, Tensor<B, 4>)>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    total: usize,
) -> (Tensor<B, 4>, Tensor<B, 4>) {
    let Some((pk, pv)) = slot.take() else {
        *slot = Some((k.clone(), v.clone()));
        return (k, v);
    };
    let [b, h, capacity, d] = pk.dims();
    let past = total - k.dims()[2];
    if capacity == past || capacity < total {
        // Grown by a cat (a reserved buffer too short for this step keeps its filled prefix).
        let (pk, pv) = if capacity == past {
            (pk, pv)
        } else {
            let prefix = |t: Tensor<B, 4>| t.slice([0..b, 0..h, 0..past, 0..d]);
            (prefix(pk), prefix(pv))
        };
        let k = Tensor::cat(vec![pk, k], 2);
        let v = Tensor::cat(vec![pv, v], 2);
        *slot = Some((k.clone(), v.clone()));
        return (k, v);
    }
    let pk = write_positions(pk, k, past);
    let pv = write_positions(pv, v, past);
    let filled = |t: &Tensor<B, 4>| t.clone().slice([0..b, 0..h, 0..total, 0..d]);
    let (k, v) = (filled(&pk), filled(&pv));
    *slot = Some((pk, pv));
    (k, v)
}

/// Reserves a cache slot's keys and values `[b, kv_heads, len, d]` as buffers of `capacity`
/// positions (the first `len` filled, the rest zeros), so that [`append_kv`] writes the next
/// `capacity − len` positions in place. A slot already that long is left as it is.
pub(crate) fn reserve_kv<B: Backend>(
    slot: &mut Option<(Tensor<B, 4>, Tensor<B, 4>)>,
    capacity: usize,
) {
    let Some((k, v)) = slot.take() else {
        return;
    };
    let grow = |t: Tensor<B, 4>| {
        let [b, h, len, d] = t.dims();
        if len >= capacity {
            return t;
        }
        let buffer = Tensor::<B, 4>::zeros([b, h, capacity, d], (&t.device(), t.dtype()));
        write_positions(buffer, t, 0)
    };
    *slot = Some((grow(k), grow(v)));
}

/// `buffer[:, :, at..at + l, :] = values` for `values` `[b, h, l, d]`. On the Flex backend the
/// write goes into `buffer`'s own storage when nothing else holds it (burn-flex's
/// `slice_assign` copies the whole buffer first: it keeps a second handle on its input before
/// writing; [`crate::flex::write_positions`]); elsewhere, or for a shared buffer, it is
/// `slice_assign`.
pub(crate) fn write_positions<B: Backend>(
    buffer: Tensor<B, 4>,
    values: Tensor<B, 4>,
    at: usize,
) -> Tensor<B, 4> {
    use burn::tensor::TensorPrimitive;
    let [b, h, capacity, d] = buffer.dims();
    let l = values.dims()[2];
    debug_assert!(at + l <= capacity, "writing {at}..{} of {capacity}", at + l);
    let TensorPrimitive::Float(mut dst) = buffer.into_primitive() else {
        unreachable!("a KV cache holds float tensors")
    };
    let written = match values.clone().into_primitive() {
        TensorPrimitive::Float(src) => {
            crate::flex::write_positions::<B>(&mut dst, src, [b, h, capacity, d], l, at)
        }
        TensorPrimitive::QFloat(_) => false,
    };
    let buffer = Tensor::<B, 4>::from_primitive(TensorPrimitive::Float(dst));
    if written {
        buffer
    } else {
        buffer.slice_assign([0..b, 0..h, at..at + l, 0..d], values)
    }
}
