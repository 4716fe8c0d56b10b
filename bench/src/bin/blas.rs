//! `blas [update|head|decode|all]`: the benchmark model's f32 matmul shapes timed through burn's
//! `Tensor::matmul` on the `Flex` backend (burn-flex's strided `gemm` call, with its own
//! parallelism choice), and, built with `--features openblas`, through the system OpenBLAS's
//! `cblas_sgemm` on the same data (`apt-get install libopenblas-dev`; nothing is downloaded,
//! the library is linked by name).
//!
//! Each product is laid out as the models lay it out: a linear layer's forward is `X · Wᵀ` with
//! `W` stored `[out, in]` (the right operand is a transposed view), its input gradient
//! `dY · W` (both row-major), its weight gradient `Xᵀ · dY` (the left operand is a transposed
//! view; K = the number of rows). For OpenBLAS the same stored buffers are passed with
//! `CblasTrans` where the view is transposed.
//!
//! Decode rows: `BLAS_DECODE_ROWS` (default "64 8").
//!
//! Threads: `RAYON_NUM_THREADS` for Flex (default: all cores), `BLAS_THREADS` for OpenBLAS
//! (default 2, set by `openblas_set_num_threads`). Repetitions: `BLAS_REPS` (default 7 for the big
//! products, 10× that for the decode ones) after two warm-up calls; the two implementations
//! alternate call by call, so a load change hits both. Prints a markdown table: median ms,
//! GFLOP/s, and the max difference between the two results relative to the largest |value|.
//! For the decode products it also times burn-flex's gemm call alone (`gemm-only`: its
//! small-row path off, `matmul_f32_gemm_reference`), the path before the flowrl patch.
//!
//! With `--features openblas`, burn-flex's own small-row products (≤ 64 rows) go to OpenBLAS as
//! well (the `openblas` feature of vendor/burn-flex), so `Flex` is then that path.

use std::time::Instant;

use burn::backend::Flex;
use burn::backend::flex::FlexDevice;
use burn::prelude::*;
use burn::tensor::Distribution;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[cfg(feature = "openblas")]
mod cblas {
    use std::ffi::{CStr, c_char, c_int};

    pub const ROW_MAJOR: c_int = 101;
    pub const NO_TRANS: c_int = 111;
    pub const TRANS: c_int = 112;

    #[link(name = "openblas")]
    unsafe extern "C" {
        #[allow(clippy::too_many_arguments)]
        pub fn cblas_sgemm(
            order: c_int,
            trans_a: c_int,
            trans_b: c_int,
            m: c_int,
            n: c_int,
            k: c_int,
            alpha: f32,
            a: *const f32,
            lda: c_int,
            b: *const f32,
            ldb: c_int,
            beta: f32,
            c: *mut f32,
            ldc: c_int,
        );
        pub fn openblas_set_num_threads(n: c_int);
        fn openblas_get_corename() -> *const c_char;
        fn openblas_get_config() -> *const c_char;
    }

    pub fn corename() -> String {
        unsafe { CStr::from_ptr(openblas_get_corename()) }
            .to_string_lossy()
            .into_owned()
    }

    pub fn config() -> String {
        unsafe { CStr::from_ptr(openblas_get_config()) }
            .to_string_lossy()
            .into_owned()
    }
}

/// One product `A[m, k] · B[k, n]`; `ta`/`tb`: the operand is the transposed view of a row-major
/// buffer (`A` stored `[k, m]`, `B` stored `[n, k]`).
struct Case {
    group: &'static str,
    name: String,
    m: usize,
    k: usize,
    n: usize,
    ta: bool,
    tb: bool,
}

fn linear_cases(group: &'static str, rows: usize, layers: &[(&str, usize, usize)]) -> Vec<Case> {
    let mut cases = Vec::new();
    for &(name, inp, out) in layers {
        cases.push(Case {
            group,
            name: format!("{name} fwd X·Wᵀ"),
            m: rows,
            k: inp,
            n: out,
            ta: false,
            tb: true,
        });
        cases.push(Case {
            group,
            name: format!("{name} dX = dY·W"),
            m: rows,
            k: out,
            n: inp,
            ta: false,
            tb: false,
        });
        cases.push(Case {
            group,
            name: format!("{name} dW = Xᵀ·dY"),
            m: inp,
            k: rows,
            n: out,
            ta: true,
            tb: false,
        });
    }
    cases
}

fn cases(which: &str) -> Vec<Case> {
    let mut all = Vec::new();
    if which == "update" || which == "all" {
        all.extend(linear_cases(
            "update",
            7584,
            &[
                ("q/o 512→512", 512, 512),
                ("k/v 512→256", 512, 256),
                ("gate/up 512→1408", 512, 1408),
                ("down 1408→512", 1408, 512),
            ],
        ));
    }
    if which == "head" || which == "all" {
        all.extend(linear_cases(
            "head",
            512,
            &[("lm_head 512→32000", 512, 32000)],
        ));
    }
    if which == "decode" || which == "all" {
        let rows_list: Vec<usize> = std::env::var("BLAS_DECODE_ROWS")
            .unwrap_or_else(|_| "64 8".into())
            .split_whitespace()
            .map(|r| r.parse().expect("BLAS_DECODE_ROWS: numbers"))
            .collect();
        for rows in rows_list {
            for (name, inp, out) in [
                ("q/o", 512, 512),
                ("k/v", 512, 256),
                ("gate/up", 512, 1408),
                ("down", 1408, 512),
                ("lm_head", 512, 32000),
            ] {
                all.push(Case {
                    group: "decode",
                    name: format!("{name} M={rows} X·Wᵀ"),
                    m: rows,
                    k: inp,
                    n: out,
                    ta: false,
                    tb: true,
                });
            }
        }
    }
    all
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    let which = std::env::args().nth(1).unwrap_or_else(|| "all".into());
    let reps: usize = std::env::var("BLAS_REPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(7);
    #[cfg(feature = "openblas")]
    {
        let threads: i32 = std::env::var("BLAS_THREADS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(2);
        unsafe { cblas::openblas_set_num_threads(threads) };
        println!(
            "OpenBLAS core: {}; config: {}; threads: {threads}",
            cblas::corename(),
            cblas::config()
        );
    }
    println!(
        "Flex: {} rayon threads",
        std::env::var("RAYON_NUM_THREADS").unwrap_or_else(|_| "all".into())
    );
    let device = FlexDevice;
    println!();
    println!(
        "| group | product | M×K×N | Flex ms | Flex GFLOP/s | gemm-only ms | gemm-only GFLOP/s | OpenBLAS ms | OpenBLAS GFLOP/s | BLAS/Flex speed | max rel diff |"
    );
    println!("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for c in cases(&which) {
        let stored_a = if c.ta { [c.k, c.m] } else { [c.m, c.k] };
        let stored_b = if c.tb { [c.n, c.k] } else { [c.k, c.n] };
        let a_store =
            Tensor::<Flex, 2>::random(stored_a, Distribution::Uniform(-1.0, 1.0), &device);
        let b_store =
            Tensor::<Flex, 2>::random(stored_b, Distribution::Uniform(-1.0, 1.0), &device);
        let a = if c.ta {
            a_store.clone().transpose()
        } else {
            a_store.clone()
        };
        let b = if c.tb {
            b_store.clone().transpose()
        } else {
            b_store.clone()
        };
        let n_reps = if c.group == "decode" { reps * 10 } else { reps };
        let flops = 2.0 * (c.m * c.k * c.n) as f64;

        let flex_out: Vec<f32> = a.clone().matmul(b.clone()).into_data().to_vec().unwrap();
        let mut flex_t = Vec::with_capacity(n_reps);
        // burn-flex's gemm call alone (its small-row paths off), for the decode products.
        let reference = c.group == "decode";
        let gemm_only = |a: &Tensor<Flex, 2>, b: &Tensor<Flex, 2>| {
            burn::backend::flex::ops::matmul::matmul_f32_gemm_reference(
                a.clone().into_primitive().tensor(),
                b.clone().into_primitive().tensor(),
            )
        };
        let mut ref_t = Vec::with_capacity(n_reps);
        let ref_diff = if reference {
            let r: Vec<f32> = Tensor::<Flex, 2>::from_primitive(
                burn::tensor::TensorPrimitive::Float(gemm_only(&a, &b)),
            )
            .into_data()
            .to_vec()
            .unwrap();
            let scale = r.iter().fold(0f32, |m, v| m.max(v.abs()));
            flex_out
                .iter()
                .zip(&r)
                .fold(0f32, |m, (x, y)| m.max((x - y).abs()))
                / scale
        } else {
            0.0
        };

        #[cfg(feature = "openblas")]
        let (a_buf, b_buf): (Vec<f32>, Vec<f32>) = (
            a_store.to_data().to_vec().unwrap(),
            b_store.to_data().to_vec().unwrap(),
        );
        #[cfg(feature = "openblas")]
        let blas = || -> Vec<f32> {
            let mut out: Vec<f32> = Vec::with_capacity(c.m * c.n);
            unsafe {
                cblas::cblas_sgemm(
                    cblas::ROW_MAJOR,
                    if c.ta { cblas::TRANS } else { cblas::NO_TRANS },
                    if c.tb { cblas::TRANS } else { cblas::NO_TRANS },
                    c.m as i32,
                    c.n as i32,
                    c.k as i32,
                    1.0,
                    a_buf.as_ptr(),
                    stored_a[1] as i32,
                    b_buf.as_ptr(),
                    stored_b[1] as i32,
                    0.0,
                    out.as_mut_ptr(),
                    c.n as i32,
                );
                out.set_len(c.m * c.n);
            }
            out
        };
        #[cfg(feature = "openblas")]
        let mut blas_t = Vec::with_capacity(n_reps);
        #[cfg(feature = "openblas")]
        let blas_out = blas();

        for i in 0..n_reps + 2 {
            let t = Instant::now();
            let y = a.clone().matmul(b.clone());
            let dt = t.elapsed().as_secs_f64();
            drop(y);
            if i >= 2 {
                flex_t.push(dt);
            }
            if reference {
                let t = Instant::now();
                let y = gemm_only(&a, &b);
                let dt = t.elapsed().as_secs_f64();
                drop(y);
                if i >= 2 {
                    ref_t.push(dt);
                }
            }
            #[cfg(feature = "openblas")]
            {
                let t = Instant::now();
                let y = blas();
                let dt = t.elapsed().as_secs_f64();
                drop(y);
                if i >= 2 {
                    blas_t.push(dt);
                }
            }
        }
        let flex_ms = median(&mut flex_t) * 1e3;
        let flex_gf = flops / flex_ms / 1e6;
        let ref_cols = if reference {
            let ms = median(&mut ref_t) * 1e3;
            format!("{ms:.3} | {:.1}", flops / ms / 1e6)
        } else {
            "= Flex | ".to_string()
        };
        #[cfg(feature = "openblas")]
        let (blas_cols, ratio, diff) = {
            let blas_ms = median(&mut blas_t) * 1e3;
            let scale = flex_out.iter().fold(0f32, |m, v| m.max(v.abs()));
            let diff = flex_out
                .iter()
                .zip(&blas_out)
                .fold(0f32, |m, (x, y)| m.max((x - y).abs()))
                / scale;
            (
                format!("{blas_ms:.3} | {:.1}", flops / blas_ms / 1e6),
                format!("{:.2}×", flex_ms / blas_ms),
                format!(
                    "{diff:.1e}{}",
                    if reference {
                        format!(" (Flex vs gemm-only {ref_diff:.1e})")
                    } else {
                        String::new()
                    }
                ),
            )
        };
        #[cfg(not(feature = "openblas"))]
        let (blas_cols, ratio, diff) = {
            let _ = &flex_out;
            (
                "– | –".to_string(),
                "–".to_string(),
                if reference {
                    format!("Flex vs gemm-only {ref_diff:.1e}")
                } else {
                    "–".to_string()
                },
            )
        };
        println!(
            "| {} | {} | {}×{}×{} | {flex_ms:.3} | {flex_gf:.1} | {ref_cols} | {blas_cols} | {ratio} | {diff} |",
            c.group, c.name, c.m, c.k, c.n,
        );
    }
}
