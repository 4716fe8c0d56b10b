//! Section 6 (CUDA only): NCCL loaded as the run loads it, one rank, and a bucketed in-place
//! all-reduce on a CUDA stream.

use std::time::Instant;

use anyhow::{Result, bail};
use serde_json::json;

use super::{Report, median, round};

/// Section 6 of the module doc: NCCL by soname, one rank, a bucketed all-reduce.
pub(super) fn nccl(ordinal: usize, rep: &mut Report) -> Result<()> {
    use cudarc::driver::{CudaContext, DevicePtr};
    use flowrl_nodes::runtime::collective::nccl::{BUCKET_VALUES, Nccl};
    let nccl = Nccl::get()?;
    let ctx = CudaContext::new(ordinal).map_err(|e| anyhow::anyhow!("CUDA context: {e:?}"))?;
    ctx.bind_to_thread()
        .map_err(|e| anyhow::anyhow!("CUDA context: {e:?}"))?;
    let stream = ctx.default_stream();
    let n = 3 * BUCKET_VALUES / 2;
    let host: Vec<f32> = (0..n).map(|i| (i % 4093) as f32 * 0.5).collect();
    let cuda = |e: cudarc::driver::DriverError| anyhow::anyhow!("CUDA: {e:?}");
    let buf = stream.clone_htod(&host).map_err(cuda)?;
    let id = nccl.unique_id()?;
    let t = Instant::now();
    let mut comm = nccl.communicator(&id, 1, 0)?;
    let init_s = t.elapsed().as_secs_f64();
    let raw = stream.cu_stream() as *mut std::ffi::c_void;
    let mut times = Vec::new();
    {
        let (ptr, _sync) = buf.device_ptr(&stream);
        for _ in 0..4 {
            let t = Instant::now();
            // SAFETY: `buf` holds `n` f32 values on this device until the stream has run.
            unsafe { comm.all_reduce_sum_f32(ptr, ptr, n, raw)? };
            stream.synchronize().map_err(cuda)?;
            times.push(t.elapsed().as_secs_f64());
        }
    }
    let back = stream.clone_dtoh(&buf).map_err(cuda)?;
    if back != host {
        bail!("a one-rank all-reduce changed the values");
    }
    let ms = median(times[1..].to_vec()) * 1e3;
    let mb = 4.0 * n as f64 / 1e6;
    rep.emit(json!({
        "bench": "nccl",
        "library": nccl.path,
        "version": nccl.version_text(),
        "ranks": comm.world(),
        "mb": round(mb, 1),
        "init_s": round(init_s, 3),
        "ms": round(ms, 3),
        "gb_s": round(mb / ms, 1),
    }));
    Ok(())
}
