//! `bench-gpu-micro`: the micro-benchmarks that settle the GPU performance model's assumptions
//! (shared/research/gpu_path.md §1.6, §1.7, §6), measured with burn's tensor API on the unfused
//! cubecl backend the nodes run on (`CubeBackend<R, f32, i32, u8>`), generic over the cubecl
//! runtime `R`: CUDA on a GPU (bench/gpu/check.sh's `micro` step, bf16), Vulkan here (lavapipe:
//! a dry run of the same code at reduced sizes, f32, since lavapipe has no bf16 and caps a
//! buffer at 128 MiB).
//!
//!     bench-gpu-micro --device cuda   [--budget-s 50] [--jsonl FILE]
//!     bench-gpu-micro --device vulkan                          (reduced sizes: --small)
//!
//! `--small` (the default on Vulkan) divides the GEMMs' N and K by 8 and takes M = 512, 64 and
//! 1024, the reads by 10, the elementwise tensors by 16: every buffer stays under lavapipe's
//! 128 MiB. `--help` lists the other options.
//!
//! Sections, in this order (each record is printed as one JSON line when it is measured, and
//! appended to `--jsonl`, so a run cut by a timeout keeps what it measured; a markdown table of
//! everything follows at the end):
//!
//! 1. **launch**: µs per kernel launch, 10 000 `add_scalar`s on a 1-element tensor, timed from a
//!    synced device to a synced device; also the host's issue time alone (before the final sync).
//! 2. **read**: device → host bandwidth of `into_data` for 100 MB and 311 MB f32 tensors (311 MB is
//!    the rollout's logits read, 512 rows × 151 936 f32), median of 3 after a warm-up read.
//! 3. **elementwise**: GB/s of `a + b` over 256 MB tensors, contiguous and with a row broadcast.
//! 4. **first pass**: build, first and second forward, first and second forward + backward of a
//!    small model, under `Autodiff` as the update runs it: on CUDA a 2-layer slice of
//!    `bench/gpu/qwen2_5_vl_3b/config.json` (the 3B's widths, vocabulary and vision blocks, so
//!    its kernels and autotune keys are those of the 3B step, which then finds them in the
//!    caches), 16 rows of a 109-token prompt with one 224×224 image each (the 3B step's prefill);
//!    on Vulkan `assets/tiny-qwen2-vl/config.json`, 2 rows. first − second ≈ kernel
//!    compilation and autotune. It comes before the GEMMs because that cost is only measurable with cold
//!    caches (a first run), while the GEMMs' throughput is the same on a second run.
//! 5. **gemm**: TFLOP/s of `x · Wᵀ` (`W` stored `[N, K]` as `layers::Linear` holds it) at the
//!    Qwen2.5-VL-3B shapes N×K = 2048×2048 (o_proj, q_proj), 2560×2048 (q/k/v fused width),
//!    11008×2048 (gate, up), 2048×11008 (down), 151936×2048 (LM head), for M = 4096, then 512,
//!    then 26 624 rows. Per shape: the first call (kernel compilation and autotune of a new
//!    autotune key, unless the caches hold it) and the steady time over enough repetitions for
//!    ~0.25 s.
//!
//! 6. **nccl** (CUDA only, measured right after the `info` record since it takes a second):
//!    NCCL loaded as the run loads it (`flowrl_nodes::runtime::collective::nccl`: by its soname
//!    `libnccl.so.2`, or from a pip wheel), a communicator of one rank on the device, and a
//!    bucketed in-place all-reduce of 96 MB (two buckets) on a CUDA stream: its time, and that
//!    the values came back unchanged (the sum over one rank). Without NCCL the record carries the
//!    loader's one-line error, which names the package to install.
//!
//! Sections 4 and 5 start no new measurement (a first-pass phase, a GEMM) once `--budget-s`
//! seconds have passed since start; a `skipped` record says so.
//!
//! cubecl's configuration is not set here: a `cubecl.toml` in the working directory or an
//! ancestor applies (bench/gpu/check.sh installs bench/gpu/cubecl.toml for its run), and the
//! `info` record prints the compilation and autotune caches it resolved.

#[cfg(any(feature = "cuda", feature = "vulkan"))]
mod micro {
    use std::fs::File;
    use std::io::Write;
    use std::path::PathBuf;
    use std::time::Instant;

    use anyhow::{Context, Result, bail};
    use burn::backend::Autodiff;
    use burn::module::Module;
    use burn::prelude::*;
    use burn::tensor::{DType, Distribution};
    use burn_cubecl::cubecl::config::{CubeClRuntimeConfig, RuntimeConfig};
    use burn_cubecl::{CubeBackend, CubeRuntime};
    use flowrl_models::weights::Precision;
    use flowrl_models::{Model, PaddedBatch, ProcessedImage};
    use serde_json::{Value, json};

    /// burn's cubecl kernels without fusion, as the nodes run them.
    type Gpu<R> = CubeBackend<R, f32, i32, u8>;

    /// The LM head's width: Qwen2.5-VL's vocabulary.
    const VOCAB: usize = 151_936;
    /// N×K of the 3B's linear maps (`W` is `[N, K]`).
    const GEMM_NK: [(usize, usize, &str); 5] = [
        (2048, 2048, "q_proj / o_proj"),
        (2560, 2048, "q/k/v fused"),
        (11008, 2048, "gate / up"),
        (2048, 11008, "down"),
        (VOCAB, 2048, "LM head"),
    ];

    pub struct Args {
        pub device: String,
        pub budget_s: f64,
        pub jsonl: Option<PathBuf>,
        pub small: bool,
        pub dtype: DType,
        pub model_config: PathBuf,
        pub layers: usize,
        pub rows: usize,
        pub vocab: Option<usize>,
        pub skip: Vec<String>,
    }

    pub fn parse(args: &[String]) -> Result<Args> {
        let mut device = "cuda".to_string();
        let mut budget_s = 50.0;
        let mut jsonl = None;
        let mut small = None;
        let mut dtype = None;
        let mut model_config = None;
        let mut layers = 2;
        let mut rows = None;
        let mut vocab = None;
        let mut skip = Vec::new();
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let mut value = || {
                it.next()
                    .cloned()
                    .with_context(|| format!("{a} needs a value"))
            };
            match a.as_str() {
                "--device" => device = value()?,
                "--budget-s" => budget_s = value()?.parse().context("--budget-s")?,
                "--jsonl" => jsonl = Some(PathBuf::from(value()?)),
                "--small" => small = Some(true),
                "--full" => small = Some(false),
                "--dtype" => {
                    dtype = Some(match value()?.as_str() {
                        "bf16" => DType::BF16,
                        "f32" => DType::F32,
                        "f16" => DType::F16,
                        other => bail!("--dtype {other}: f32, bf16 or f16"),
                    })
                }
                "--model-config" => model_config = Some(PathBuf::from(value()?)),
                "--layers" => layers = value()?.parse().context("--layers")?,
                "--rows" => rows = Some(value()?.parse().context("--rows")?),
                "--vocab" => vocab = Some(value()?.parse().context("--vocab")?),
                "--skip" => skip.extend(value()?.split(',').map(str::to_string)),
                "-h" | "--help" => {
                    println!(
                        "usage: bench-gpu-micro [--device cuda|vulkan] [--budget-s S] [--jsonl FILE] \
                         [--small|--full] [--dtype f32|bf16|f16] [--model-config PATH] [--layers N] \
                         [--rows N] [--vocab N] [--skip nccl,launch,read,elementwise,gemm,first_pass]\n\
                         built with: {}",
                        super::built_with()
                    );
                    std::process::exit(0);
                }
                other => bail!("unknown argument {other} (--help)"),
            }
        }
        let cuda = device.starts_with("cuda");
        Ok(Args {
            small: small.unwrap_or(!cuda),
            dtype: dtype.unwrap_or(if cuda { DType::BF16 } else { DType::F32 }),
            model_config: model_config.unwrap_or_else(|| {
                PathBuf::from(if cuda {
                    "bench/gpu/qwen2_5_vl_3b/config.json"
                } else {
                    "assets/tiny-qwen2-vl/config.json"
                })
            }),
            rows: rows.unwrap_or(if cuda { 16 } else { 2 }),
            device,
            budget_s,
            jsonl,
            layers,
            vocab,
            skip,
        })
    }

    /// The records, printed and appended to the JSON lines file as they come.
    struct Report {
        start: Instant,
        budget_s: f64,
        file: Option<File>,
        records: Vec<Value>,
    }

    impl Report {
        fn emit(&mut self, mut record: Value) {
            record["t_s"] = json!(round(self.start.elapsed().as_secs_f64(), 2));
            let line = record.to_string();
            println!("{line}");
            if let Some(f) = &mut self.file {
                let _ = writeln!(f, "{line}");
                let _ = f.flush();
            }
            self.records.push(record);
        }

        /// Whether the budget is spent; if so, a `skipped` record for `what`.
        fn over_budget(&mut self, what: &str) -> bool {
            let spent = self.start.elapsed().as_secs_f64();
            if spent > self.budget_s {
                self.emit(json!({"bench": "skipped", "what": what,
                    "reason": format!("budget: {spent:.0} s of {:.0} s spent", self.budget_s)}));
                return true;
            }
            false
        }
    }

    fn round(x: f64, digits: i32) -> f64 {
        let p = 10f64.powi(digits);
        (x * p).round() / p
    }

    fn median(mut xs: Vec<f64>) -> f64 {
        xs.sort_by(f64::total_cmp);
        xs[xs.len() / 2]
    }

    fn dtype_name(d: DType) -> &'static str {
        match d {
            DType::BF16 => "bf16",
            DType::F16 => "f16",
            DType::F32 => "f32",
            _ => "other",
        }
    }

    fn sync<B: Backend>(device: &B::Device) -> Result<()> {
        B::sync(device).map_err(|e| anyhow::anyhow!("syncing the device: {e:?}"))
    }

    /// Seconds of `f`, from a synced device to a synced device.
    fn timed<B: Backend, T>(device: &B::Device, f: impl FnOnce() -> T) -> Result<(f64, T)> {
        sync::<B>(device)?;
        let t = Instant::now();
        let out = f();
        sync::<B>(device)?;
        Ok((t.elapsed().as_secs_f64(), out))
    }

    pub fn run<R: CubeRuntime>(device: R::Device, args: &Args) -> Result<()> {
        let start = Instant::now();
        let file = match &args.jsonl {
            Some(p) => Some(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(p)
                    .with_context(|| format!("opening {}", p.display()))?,
            ),
            None => None,
        };
        let mut rep = Report {
            start,
            budget_s: args.budget_s,
            file,
            records: Vec::new(),
        };
        let config = CubeClRuntimeConfig::get();
        let compilation_cache = config.compilation.cache.as_ref().map(|c| c.root());
        // The first operation initialises the device (driver, context, memory pools).
        let (init_s, _) = timed::<Gpu<R>, _>(&device, || {
            Tensor::<Gpu<R>, 1>::zeros([1], &device).into_data()
        })?;
        rep.emit(json!({
            "bench": "info",
            "device": args.device,
            "runtime": std::any::type_name::<R>(),
            "dtype": dtype_name(args.dtype),
            "small": args.small,
            "budget_s": args.budget_s,
            "device_init_s": round(init_s, 3),
            "autotune_level": format!("{:?}", config.autotune.level),
            "autotune_cache": format!("{:?} -> {}", config.autotune.cache, config.autotune.cache.root().display()),
            "compilation_cache": match (&config.compilation.cache, &compilation_cache) {
                (Some(c), Some(root)) => format!("{c:?} -> {}", root.display()),
                _ => "none (no [compilation] cache in a cubecl.toml)".to_string(),
            },
            "cwd": std::env::current_dir().map(|p| p.display().to_string()).unwrap_or_default(),
        }));
        let wants = |s: &str| !args.skip.iter().any(|k| k == s);
        #[cfg(feature = "cuda")]
        if wants("nccl") && args.device.starts_with("cuda") {
            let ordinal = args
                .device
                .split(':')
                .nth(1)
                .and_then(|i| i.parse().ok())
                .unwrap_or(0);
            if let Err(e) = nccl(ordinal, &mut rep) {
                rep.emit(json!({"bench": "nccl", "error": format!("{e:#}")}));
            }
        }
        if wants("launch") {
            launch::<Gpu<R>>(&device, &mut rep)?;
        }
        if wants("read") {
            read::<Gpu<R>>(&device, args, &mut rep)?;
        }
        if wants("elementwise") {
            elementwise::<Gpu<R>>(&device, args, &mut rep)?;
        }
        // The first pass before the GEMMs: its compile + autotune time is only measurable while
        // the caches are cold (a first run), while GEMM throughput is the same on a second run.
        if wants("first_pass")
            && !rep.over_budget("first pass")
            && let Err(e) = first_pass::<R>(&device, args, &mut rep)
        {
            rep.emit(json!({"bench": "first_pass", "phase": "error", "error": format!("{e:#}")}));
        }
        if wants("gemm") {
            // (lavapipe caps a buffer at 128 MiB: the LM head's output at 1024 rows is 78 MB)
            let ms: &[usize] = if args.small {
                &[512, 64, 1024]
            } else {
                &[4096, 512, 26624]
            };
            gemms::<Gpu<R>>(&device, args, ms, &mut rep)?;
        }
        println!();
        print!("{}", markdown(&rep.records));
        Ok(())
    }

    /// Section 6 of the module doc: NCCL by soname, one rank, a bucketed all-reduce.
    #[cfg(feature = "cuda")]
    fn nccl(ordinal: usize, rep: &mut Report) -> Result<()> {
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

    /// µs per launch: `n` `add_scalar`s on a 1-element tensor (each one kernel: the backend is
    /// unfused), after a warm-up that compiles the kernel.
    fn launch<B: Backend>(device: &B::Device, rep: &mut Report) -> Result<()> {
        let n = 10_000;
        let mut x = Tensor::<B, 1>::zeros([1], device);
        for _ in 0..100 {
            x = x.add_scalar(1.0);
        }
        sync::<B>(device)?;
        let t = Instant::now();
        for _ in 0..n {
            x = x.add_scalar(1.0);
        }
        let issue = t.elapsed().as_secs_f64();
        sync::<B>(device)?;
        let total = t.elapsed().as_secs_f64();
        let v = x
            .into_data()
            .convert::<f32>()
            .into_vec::<f32>()
            .unwrap_or_default();
        rep.emit(json!({
            "bench": "launch", "n": n,
            "us_per_launch": round(total / n as f64 * 1e6, 2),
            "issue_us_per_launch": round(issue / n as f64 * 1e6, 2),
            "check": v.first().copied().unwrap_or(f32::NAN),
        }));
        Ok(())
    }

    /// Device → host: `into_data` of f32 tensors (a clone of the handle each time: the same
    /// buffer read again), median of 3 after a warm-up read.
    fn read<B: Backend>(device: &B::Device, args: &Args, rep: &mut Report) -> Result<()> {
        let div = if args.small { 10 } else { 1 };
        let shapes: [(&str, Vec<usize>); 2] = [
            ("flat", vec![25_000_000 / div]),
            ("the rollout's logits", vec![512, VOCAB / div]),
        ];
        for (what, shape) in shapes {
            let label = match shape.as_slice() {
                [n] => format!("{n} f32 ({what})"),
                dims => format!(
                    "{} f32 ({what})",
                    dims.iter()
                        .map(|d| d.to_string())
                        .collect::<Vec<_>>()
                        .join(" x ")
                ),
            };
            let t = Tensor::<B, 2>::random(
                if shape.len() == 1 {
                    [1, shape[0]]
                } else {
                    [shape[0], shape[1]]
                },
                Distribution::Uniform(-1.0, 1.0),
                device,
            );
            let bytes = t.shape().num_elements() * 4;
            sync::<B>(device)?;
            let _ = t.clone().into_data();
            let mut times = Vec::new();
            for _ in 0..3 {
                sync::<B>(device)?;
                let s = Instant::now();
                let data = t.clone().into_data();
                times.push(s.elapsed().as_secs_f64());
                assert_eq!(data.bytes.len(), bytes);
            }
            let med = median(times.clone());
            rep.emit(json!({
                "bench": "read", "label": label, "mb": round(bytes as f64 / 1e6, 1),
                "ms": times.iter().map(|s| round(s * 1e3, 2)).collect::<Vec<_>>(),
                "gb_s": round(bytes as f64 / med / 1e9, 2),
            }));
        }
        Ok(())
    }

    /// `a + b` over `[rows, cols]` f32 tensors: contiguous (`b` the same shape) and with a row
    /// broadcast (`b` `[1, cols]`); bytes = what the kernel must move (2 reads + 1 write, or
    /// 1 read + 1 write for the broadcast).
    fn elementwise<B: Backend>(device: &B::Device, args: &Args, rep: &mut Report) -> Result<()> {
        let (rows, cols) = if args.small {
            (1024, 4096)
        } else {
            (16384, 4096)
        };
        let a = Tensor::<B, 2>::random([rows, cols], Distribution::Uniform(-1.0, 1.0), device);
        let b = Tensor::<B, 2>::random([rows, cols], Distribution::Uniform(-1.0, 1.0), device);
        let row = Tensor::<B, 2>::random([1, cols], Distribution::Uniform(-1.0, 1.0), device);
        let tensor_bytes = (rows * cols * 4) as f64;
        for (kind, moved) in [
            ("contiguous", 3.0 * tensor_bytes),
            ("row broadcast", 2.0 * tensor_bytes),
        ] {
            let add = || {
                if kind == "contiguous" {
                    a.clone() + b.clone()
                } else {
                    a.clone() + row.clone()
                }
            };
            let _ = timed::<B, _>(device, add)?; // compile
            let reps = 20;
            let (s, _) = timed::<B, _>(device, || {
                for _ in 0..reps {
                    let _ = add();
                }
            })?;
            rep.emit(json!({
                "bench": "elementwise", "kind": kind, "mb": round(tensor_bytes / 1e6, 1),
                "us": round(s / reps as f64 * 1e6, 1),
                "gb_s": round(moved * reps as f64 / s / 1e9, 1),
            }));
        }
        Ok(())
    }

    fn gemms<B: Backend>(
        device: &B::Device,
        args: &Args,
        ms: &[usize],
        rep: &mut Report,
    ) -> Result<()> {
        let div = if args.small { 8 } else { 1 };
        for &m in ms {
            for &(n, k, what) in &GEMM_NK {
                let (n, k) = (n / div, k / div);
                let label = format!("gemm M={m} N={n} K={k} ({what})");
                if rep.over_budget(&label) {
                    continue;
                }
                gemm::<B>(device, args, m, n, k, what, rep)?;
            }
        }
        Ok(())
    }

    /// `x · Wᵀ` with `x` `[m, k]` and `W` `[n, k]`, both in the compute dtype.
    fn gemm<B: Backend>(
        device: &B::Device,
        args: &Args,
        m: usize,
        n: usize,
        k: usize,
        what: &str,
        rep: &mut Report,
    ) -> Result<()> {
        let dist = Distribution::Normal(0.0, 1.0);
        let x = Tensor::<B, 2>::random([m, k], dist, device).cast(args.dtype);
        let w = Tensor::<B, 2>::random([n, k], dist, device).cast(args.dtype);
        let run = || x.clone().matmul(w.clone().transpose());
        let (first, out) = timed::<B, _>(device, run)?;
        let out_dtype = out.dtype();
        drop(out);
        let (one, _) = timed::<B, _>(device, || drop(run()))?;
        let reps = ((0.25 / one.max(1e-6)) as usize).clamp(3, 200);
        let (total, _) = timed::<B, _>(device, || {
            for _ in 0..reps {
                drop(run());
            }
        })?;
        let s = total / reps as f64;
        let flop = 2.0 * m as f64 * n as f64 * k as f64;
        rep.emit(json!({
            "bench": "gemm", "m": m, "n": n, "k": k, "what": what,
            "dtype": dtype_name(args.dtype), "out_dtype": dtype_name(out_dtype),
            "first_s": round(first, 3), "ms": round(s * 1e3, 3), "reps": reps,
            "tflops": round(flop / s / 1e12, if args.small { 4 } else { 2 }),
        }));
        Ok(())
    }

    /// The model's config: the file's, cut to `layers` decoder layers and vision blocks (full
    /// attention kept in the last block when the family has `fullatt_block_indexes`), its
    /// vocabulary optionally replaced.
    fn sliced_config(args: &Args) -> Result<(Value, String)> {
        let text = std::fs::read_to_string(&args.model_config)
            .with_context(|| format!("reading {}", args.model_config.display()))?;
        let mut json: Value = serde_json::from_str(&text)?;
        let l = args.layers.max(1);
        let t = &mut json["text_config"];
        if t["num_hidden_layers"]
            .as_u64()
            .is_some_and(|n| n as usize > l)
        {
            t["num_hidden_layers"] = json!(l);
        }
        if let Some(v) = args.vocab {
            t["vocab_size"] = json!(v);
        }
        let v = &mut json["vision_config"];
        if v["depth"].as_u64().is_some_and(|n| n as usize > l) {
            v["depth"] = json!(l);
            if v.get("fullatt_block_indexes").is_some() {
                v["fullatt_block_indexes"] = json!([l - 1]);
            }
        }
        let name = format!(
            "{} cut to {} layers / {} vision blocks, vocab {}",
            args.model_config.display(),
            json["text_config"]["num_hidden_layers"],
            json["vision_config"]["depth"],
            json["text_config"]["vocab_size"]
        );
        Ok((json, name))
    }

    /// `rows` prompts as the 3B step's: 8 text tokens, vision start, the 64 tokens of one
    /// 224×224 image (16×16 patches), vision end, text up to 109 tokens.
    fn prompts(json: &Value, rows: usize) -> Result<(PaddedBatch, Vec<ProcessedImage>)> {
        let id = |key: &str| -> Result<u32> {
            json[key]
                .as_u64()
                .map(|v| v as u32)
                .with_context(|| format!("config.json has no {key}"))
        };
        let (start, image, end) = (
            id("vision_start_token_id")?,
            id("image_token_id")?,
            id("vision_end_token_id")?,
        );
        let vc = &json["vision_config"];
        let patch = vc["patch_size"].as_u64().unwrap_or(14) as usize;
        let temporal = vc["temporal_patch_size"].as_u64().unwrap_or(2) as usize;
        let channels = vc["in_channels"].as_u64().unwrap_or(3) as usize;
        let merge = vc["spatial_merge_size"].as_u64().unwrap_or(2) as usize;
        let (gh, gw) = (16, 16);
        let dim = channels * temporal * patch * patch;
        let n = gh * gw;
        let mut batch_rows = Vec::new();
        let mut images = Vec::new();
        for r in 0..rows {
            let tokens = n / (merge * merge);
            images.push(ProcessedImage {
                pixel_values: (0..n * dim)
                    .map(|i| (((i * 7919 + r * 104_729) % 1000) as f32 / 500.0) - 1.0)
                    .collect(),
                shape: vec![n, dim],
                grid: vec![1, gh, gw],
                num_tokens: tokens,
                patch_positions: None,
                video: None,
            });
            // Text ids below 400: inside every vocabulary here and below the special ids.
            let text = |i: usize| (1 + (r * 131 + i * 71) % 399) as u32;
            let mut row: Vec<u32> = (0..8).map(text).collect();
            row.push(start);
            row.extend(std::iter::repeat_n(image, tokens));
            row.push(end);
            let mut i = 8;
            while row.len() < 109 {
                row.push(text(i));
                i += 1;
            }
            batch_rows.push(row);
        }
        Ok((PaddedBatch::left_pad(&batch_rows, 0), images))
    }

    /// Build, forward ×2, forward + backward ×2 of the sliced model under `Autodiff`, one record
    /// per phase (a timeout keeps the phases measured); no phase starts after the budget.
    fn first_pass<R: CubeRuntime>(device: &R::Device, args: &Args, rep: &mut Report) -> Result<()> {
        type Ad<R> = Autodiff<Gpu<R>>;
        let (json, name) = sliced_config(args)?;
        let precision = match args.dtype {
            DType::BF16 => Precision::BF16,
            DType::F16 => Precision::F16,
            _ => Precision::F32,
        };
        let (build_s, model) = timed::<Ad<R>, _>(device, || {
            Model::<Ad<R>>::random_with_precision(&json.to_string(), device, 7, precision)
        })?;
        let model = model?;
        let (batch, images) = prompts(&json, args.rows)?;
        rep.emit(json!({
            "bench": "first_pass", "phase": "build", "model": name, "params": model.num_params(),
            "precision": dtype_name(args.dtype), "rows": args.rows,
            "tokens": batch.batch * batch.len, "s": round(build_s, 3),
        }));
        let loss = |model: &Model<Ad<R>>| -> Result<Tensor<Ad<R>, 1>> {
            Ok(model
                .logits(&batch, &images, device)?
                .cast(DType::F32)
                .mean())
        };
        for (phase, backward) in [
            ("forward 1", false),
            ("forward 2", false),
            ("forward+backward 1", true),
            ("forward+backward 2", true),
        ] {
            if rep.over_budget(&format!("first pass, {phase}")) {
                break;
            }
            let (s, done) = timed::<Ad<R>, _>(device, || -> Result<()> {
                let l = loss(&model)?;
                if backward {
                    drop(l.backward());
                } else {
                    let _ = l.into_data();
                }
                Ok(())
            })?;
            done?;
            rep.emit(json!({"bench": "first_pass", "phase": phase, "s": round(s, 3)}));
        }
        Ok(())
    }

    /// The markdown table of the records.
    pub fn markdown(records: &[Value]) -> String {
        let mut md = String::new();
        let f = |v: &Value| match v {
            Value::Null => "–".to_string(),
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        for r in records.iter().filter(|r| r["bench"] == "info") {
            md += &format!(
                "bench-gpu-micro on {} ({}), {}; device init {} s; autotune {}; autotune cache {}; compilation cache {}\n\n",
                f(&r["device"]),
                f(&r["runtime"]),
                f(&r["dtype"]),
                f(&r["device_init_s"]),
                f(&r["autotune_level"]),
                f(&r["autotune_cache"]),
                f(&r["compilation_cache"])
            );
        }
        md += "| measurement | value |\n|---|---:|\n";
        for r in records {
            let line = match r["bench"].as_str() {
                Some("launch") => format!(
                    "| µs per launch ({} adds, synced; host issue alone {} µs) | {} |",
                    f(&r["n"]),
                    f(&r["issue_us_per_launch"]),
                    f(&r["us_per_launch"])
                ),
                Some("read") => format!(
                    "| device → host read, {} ({} MB; ms {}) GB/s | {} |",
                    f(&r["label"]),
                    f(&r["mb"]),
                    f(&r["ms"]),
                    f(&r["gb_s"])
                ),
                Some("elementwise") => format!(
                    "| elementwise add, {} ({} MB tensors, {} µs) GB/s | {} |",
                    f(&r["kind"]),
                    f(&r["mb"]),
                    f(&r["us"]),
                    f(&r["gb_s"])
                ),
                Some("gemm") => format!(
                    "| {} GEMM M={} N={} K={} ({}): TFLOP/s (steady {} ms × {}; first call {} s) | {} |",
                    f(&r["dtype"]),
                    f(&r["m"]),
                    f(&r["n"]),
                    f(&r["k"]),
                    f(&r["what"]),
                    f(&r["ms"]),
                    f(&r["reps"]),
                    f(&r["first_s"]),
                    f(&r["tflops"])
                ),
                Some("first_pass") if r["phase"] == "error" => {
                    format!("| first pass | error: {} |", f(&r["error"]))
                }
                Some("first_pass") if r["phase"] == "build" => format!(
                    "| first pass of {} ({} params, {}, {} rows, {} tokens): build s | {} |",
                    f(&r["model"]),
                    f(&r["params"]),
                    f(&r["precision"]),
                    f(&r["rows"]),
                    f(&r["tokens"]),
                    f(&r["s"])
                ),
                Some("first_pass") => format!(
                    "| … {} s{} | {} |",
                    f(&r["phase"]),
                    if f(&r["phase"]).ends_with(" 1") {
                        " (compile + autotune + run)"
                    } else {
                        ""
                    },
                    f(&r["s"])
                ),
                Some("nccl") if r.get("error").is_some() => {
                    format!("| NCCL | error: {} |", f(&r["error"]))
                }
                Some("nccl") => format!(
                    "| NCCL {} ({}), {} rank: in-place all-reduce of {} MB, ms (communicator {} s) | {} |",
                    f(&r["version"]),
                    f(&r["library"]),
                    f(&r["ranks"]),
                    f(&r["mb"]),
                    f(&r["init_s"]),
                    f(&r["ms"])
                ),
                Some("skipped") => format!("| {} | skipped: {} |", f(&r["what"]), f(&r["reason"])),
                _ => continue,
            };
            md += &line;
            md.push('\n');
        }
        md
    }
}

#[cfg(any(feature = "cuda", feature = "vulkan"))]
fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args = micro::parse(&args)?;
    let index = |d: &str| -> usize {
        d.split(':')
            .nth(1)
            .and_then(|i| i.parse().ok())
            .unwrap_or(0)
    };
    match args.device.split(':').next().unwrap_or("") {
        #[cfg(feature = "cuda")]
        "cuda" => micro::run::<burn_cubecl::cubecl::cuda::CudaRuntime>(
            burn::backend::cuda::CudaDevice {
                index: index(&args.device),
            },
            &args,
        ),
        #[cfg(feature = "vulkan")]
        "vulkan" => {
            use burn::backend::wgpu::{WgpuDevice, WgpuRuntime};
            let device = match index(&args.device) {
                0 => WgpuDevice::DefaultDevice,
                n => WgpuDevice::DiscreteGpu(n),
            };
            micro::run::<WgpuRuntime>(device, &args)
        }
        other => anyhow::bail!("--device {other}: this build has {}", built_with()),
    }
}

/// The runtimes this build has.
#[cfg(any(feature = "cuda", feature = "vulkan"))]
fn built_with() -> String {
    [
        cfg!(feature = "cuda").then_some("cuda"),
        cfg!(feature = "vulkan").then_some("vulkan"),
    ]
    .into_iter()
    .flatten()
    .collect::<Vec<_>>()
    .join(", ")
}

#[cfg(not(any(feature = "cuda", feature = "vulkan")))]
fn main() {
    eprintln!(
        "bench-gpu-micro needs a GPU backend: cargo build --release -p flowrl-bench --features cuda \
         (or vulkan) --bin bench-gpu-micro"
    );
    std::process::exit(2);
}

/// The flowrl binary's allocator (the weight draw of the first pass allocates on the host).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
