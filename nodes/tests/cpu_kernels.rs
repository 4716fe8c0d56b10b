//! The CPU backend's matrix kernels are chosen at run time, so one binary runs on every x86-64
//! CPU: with burn's `x86-v4` feature (the workspace `Cargo.toml`), gemm 0.19 (under burn-flex)
//! holds both its AVX-512 kernels and its AVX2 + FMA ("x86-v3") ones, and picks one at the first
//! matmul with `is_x86_feature_detected!("avx512f")` (`gemm-common` `gemm_def!` → `init_gemm_fn`).
//! Nothing is compiled with `target-feature`; burn-flex's elementwise SIMD (macerator) dispatches
//! the same way.
//!
//! There is no switch in gemm, pulp or std to turn the AVX-512 kernels off in a process, so
//! [`the_avx2_kernels_give_the_same_products`] forces the v3 path by running this test binary
//! under valgrind: its virtual CPU reports AVX2 and FMA but no AVX-512 (and cannot execute an
//! AVX-512 instruction: a binary that used one unconditionally would die there with SIGILL).
//! The child checks that it sees no avx512f, computes the products of [`products`] and writes
//! them out; the parent computes them on the host's kernels (AVX-512 on an AVX-512 CPU) and
//! compares. Both are also checked against an f64 reference. Without valgrind (or off x86-64)
//! the test says so and passes.

use burn::prelude::*;
use burn::tensor::backend::AutodiffBackend;

type Flex = <flowrl_nodes::runtime::backend::CpuBackend as AutodiffBackend>::InnerBackend;

/// Pseudo-random values in [-1, 1) from `seed`.
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// `(name, batch, m, k, n, transpose_rhs)`: shapes of the benchmark model's matmuls (hidden
/// 512, MLP 1408, 8 heads of 64, a 37-row micro-batch slice), with a transposed weight as a
/// `Linear` reads it, and batched attention scores. The `x·Wᵀ` products of at most 64 rows take
/// burn-flex's direct decoding kernel (`small_m`: AVX-512 on the host, AVX2 + FMA under
/// valgrind), the others gemm's.
const SHAPES: [(&str, usize, usize, usize, usize, bool); 6] = [
    ("x·W (MLP up)", 1, 37, 512, 1408, false),
    ("x·Wᵀ (strided weight)", 1, 37, 1408, 512, true),
    ("decoding x·Wᵀ", 1, 3, 515, 130, true),
    ("square", 1, 96, 96, 96, false),
    ("attention scores", 16, 33, 64, 33, true),
    ("odd sizes", 3, 7, 13, 17, false),
];

/// Every product of [`SHAPES`] on the CPU backend, concatenated, and the f64 reference bound
/// check of each element: |c − c_ref| ≤ 1e-5 · Σ_k |a_ik| |b_kj|.
fn products() -> Vec<f32> {
    let device = Default::default();
    let mut out = Vec::new();
    for (i, &(name, batch, m, k, n, transpose)) in SHAPES.iter().enumerate() {
        let a = values(batch * m * k, 2 * i as u64);
        let b = values(batch * k * n, 2 * i as u64 + 1);
        let lhs = Tensor::<Flex, 3>::from_data(TensorData::new(a.clone(), [batch, m, k]), &device);
        // `b` holds the right operand as [k, n] per batch entry; a transposed one is stored
        // [n, k] and read through `swap_dims` (strides), as a Linear weight.
        let rhs = if transpose {
            let mut bt = vec![0.0; b.len()];
            for e in 0..batch {
                for r in 0..k {
                    for c in 0..n {
                        bt[e * k * n + c * k + r] = b[e * k * n + r * n + c];
                    }
                }
            }
            Tensor::<Flex, 3>::from_data(TensorData::new(bt, [batch, n, k]), &device)
                .swap_dims(1, 2)
        } else {
            Tensor::<Flex, 3>::from_data(TensorData::new(b.clone(), [batch, k, n]), &device)
        };
        let c = lhs.matmul(rhs).into_data().into_vec::<f32>().unwrap();
        for e in 0..batch {
            for r in 0..m {
                for col in 0..n {
                    let (mut exact, mut bound) = (0f64, 0f64);
                    for j in 0..k {
                        let x = a[e * m * k + r * k + j] as f64 * b[e * k * n + j * n + col] as f64;
                        exact += x;
                        bound += x.abs();
                    }
                    let got = c[e * m * n + r * n + col] as f64;
                    assert!(
                        (got - exact).abs() <= 1e-5 * bound,
                        "{name}: [{e}, {r}, {col}] = {got}, f64 reference {exact}"
                    );
                }
            }
        }
        out.extend(c);
    }
    out
}

fn has_avx512f() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The products against the f64 reference on the host's kernels. Run by
/// [`the_avx2_kernels_give_the_same_products`] under valgrind, it also checks that no AVX-512
/// is visible (`FLOWRL_EXPECT_NO_AVX512`) and writes the products to `FLOWRL_KERNEL_DUMP`.
#[test]
fn matmuls_match_an_f64_reference() {
    if std::env::var_os("FLOWRL_EXPECT_NO_AVX512").is_some() {
        assert!(!has_avx512f(), "the v3 run still sees avx512f");
    }
    eprintln!("avx512f detected: {}", has_avx512f());
    let c = products();
    if let Some(path) = std::env::var_os("FLOWRL_KERNEL_DUMP") {
        let bytes: Vec<u8> = c.iter().flat_map(|x| x.to_le_bytes()).collect();
        std::fs::write(path, bytes).unwrap();
    }
}

#[test]
fn the_avx2_kernels_give_the_same_products() {
    if !cfg!(target_arch = "x86_64") {
        eprintln!("skipped: not x86-64");
        return;
    }
    let valgrind = std::process::Command::new("valgrind")
        .arg("--version")
        .output();
    if !valgrind.is_ok_and(|o| o.status.success()) {
        eprintln!("skipped: no valgrind to run the AVX2 path (apt-get install valgrind)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let dump = dir.path().join("v3.f32");
    let out = std::process::Command::new("valgrind")
        .args(["--tool=none", "--quiet"])
        .arg(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "matmuls_match_an_f64_reference",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("FLOWRL_EXPECT_NO_AVX512", "1")
        .env("FLOWRL_KERNEL_DUMP", &dump)
        .env("RAYON_NUM_THREADS", "1")
        .output()
        .unwrap();
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "the run under valgrind failed:\n{log}"
    );
    assert!(log.contains("avx512f detected: false"), "{log}");
    let v3: Vec<f32> = std::fs::read(&dump)
        .unwrap()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let host = products();
    assert_eq!(v3.len(), host.len());
    let scale = host.iter().fold(0f32, |m, x| m.max(x.abs()));
    let worst = v3
        .iter()
        .zip(&host)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    let differing = v3.iter().zip(&host).filter(|(a, b)| a != b).count();
    eprintln!(
        "host avx512f: {}; {differing} of {} products differ from the AVX2 path's, by at most \
         {worst} (largest |product| {scale})",
        has_avx512f(),
        host.len()
    );
    assert!(
        worst <= 1e-5 * scale,
        "the AVX2 and host kernels differ by {worst}"
    );
}
