//! NCCL, the collectives of NVIDIA GPUs: the library found and loaded at run time, and a
//! communicator whose operations run on device buffers, queued on a CUDA stream.
//!
//! **Finding the library.** NCCL's soname is `libnccl.so.2` (Debian's and NVIDIA's `libnccl2`
//! packages, and the `nvidia-nccl-cu12` / `-cu13` wheels that PyTorch installs). cudarc 0.19's
//! own loader only tries `libnccl.so`, `libnccl.so.<CUDA major>`, `.12`, `.11`, … `.1`, so it
//! cannot load either; this module loads the library itself ([`candidates`]): `FLOWRL_NCCL` (a
//! path) first, then `libnccl.so.2` and `libnccl.so` through the system's loader
//! (`LD_LIBRARY_PATH`, the ld.so cache), then the wheels' `nvidia/nccl/lib/libnccl.so.2` under
//! the Python environments it can see (`VIRTUAL_ENV`, `CONDA_PREFIX`, `~/.local`, `/usr/local`,
//! `/usr`, `/opt/conda`). A machine without it gets one line naming what to install.
//!
//! **Using it.** Rank 0 makes a [`UniqueId`], which the run's TCP rendezvous hands to the other
//! ranks ([`UniqueId::to_f32s`]); every rank then makes its [`Communicator`] with the CUDA
//! context of its device current on the calling thread. An operation queues NCCL's kernel on
//! the stream it is given; [`Communicator::all_reduce_sum_f32`] and its siblings cut a flat
//! buffer into buckets ([`BUCKET_VALUES`]), one NCCL call each, so that the first buckets travel
//! while the last are still queued behind the kernels that wrote them. The signatures are
//! NCCL's `nccl.h` (2.x); the values of `ncclFloat32` (7) and `ncclSum` (0) are its enums'.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use anyhow::{Context, Result, bail};

/// The most f32 values one NCCL call moves (64 MiB), the bucket of the flat-buffer operations.
pub const BUCKET_VALUES: usize = 16 << 20;

/// `ncclFloat32`.
const NCCL_FLOAT32: c_int = 7;
/// `ncclSum`.
const NCCL_SUM: c_int = 0;

/// `ncclUniqueId`: 128 opaque bytes that name a communicator being formed.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UniqueId {
    pub internal: [c_char; 128],
}

impl UniqueId {
    /// The id as 32 f32 values (their bit patterns), for the run's f32 broadcast.
    pub fn to_f32s(&self) -> Vec<f32> {
        self.internal
            .chunks(4)
            .map(|b| {
                f32::from_bits(u32::from_le_bytes([
                    b[0] as u8, b[1] as u8, b[2] as u8, b[3] as u8,
                ]))
            })
            .collect()
    }

    /// The id [`UniqueId::to_f32s`] wrote.
    pub fn from_f32s(values: &[f32]) -> Result<Self> {
        if values.len() != 32 {
            bail!("an NCCL unique id is 32 values, not {}", values.len());
        }
        let mut internal = [0 as c_char; 128];
        for (i, v) in values.iter().enumerate() {
            for (k, b) in v.to_bits().to_le_bytes().into_iter().enumerate() {
                internal[4 * i + k] = b as c_char;
            }
        }
        Ok(UniqueId { internal })
    }
}

type Comm = *mut c_void;
type Stream = *mut c_void;

/// The entry points flowrl uses, resolved once.
struct Api {
    get_version: unsafe extern "C" fn(*mut c_int) -> c_int,
    get_unique_id: unsafe extern "C" fn(*mut UniqueId) -> c_int,
    comm_init_rank: unsafe extern "C" fn(*mut Comm, c_int, UniqueId, c_int) -> c_int,
    comm_destroy: unsafe extern "C" fn(Comm) -> c_int,
    comm_abort: unsafe extern "C" fn(Comm) -> c_int,
    get_error_string: unsafe extern "C" fn(c_int) -> *const c_char,
    all_reduce: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        Comm,
        Stream,
    ) -> c_int,
    reduce_scatter: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        Comm,
        Stream,
    ) -> c_int,
    all_gather:
        unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, Comm, Stream) -> c_int,
    broadcast: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        Comm,
        Stream,
    ) -> c_int,
}

/// A loaded NCCL library.
pub struct Nccl {
    api: Api,
    /// Where it was found.
    pub path: String,
    /// `ncclGetVersion`: major × 10000 + minor × 100 + patch (2.21.5 → 22105).
    pub version: i32,
    /// Keeps the entry points valid.
    _lib: libloading::Library,
}

impl std::fmt::Debug for Nccl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NCCL {} ({})", self.version_text(), self.path)
    }
}

impl Nccl {
    /// The process's NCCL, loaded on first use from the first of [`candidates`] that loads.
    pub fn get() -> Result<Arc<Nccl>> {
        static NCCL: OnceLock<std::result::Result<Arc<Nccl>, String>> = OnceLock::new();
        NCCL.get_or_init(|| {
            let env = |k: &str| std::env::var_os(k).map(PathBuf::from);
            Nccl::load_first(&candidates(&env))
                .map(Arc::new)
                .map_err(|e| format!("{e:#}"))
        })
        .clone()
        .map_err(anyhow::Error::msg)
    }

    /// The first of `candidates` that loads with NCCL's entry points; the error names what to
    /// install and every place tried.
    pub fn load_first(candidates: &[PathBuf]) -> Result<Nccl> {
        let mut tried = Vec::new();
        for c in candidates {
            match Nccl::load(c) {
                Ok(n) => return Ok(n),
                Err(e) => tried.push(format!("{} ({e:#})", c.display())),
            }
        }
        bail!(
            "NCCL (libnccl.so.2) is needed for collectives between CUDA devices and was not \
             found: install Debian's or NVIDIA's `libnccl2` package, or `pip install \
             nvidia-nccl-cu12` (nvidia-nccl-cu13 for CUDA 13), or set FLOWRL_NCCL to the \
             library's path; tried {}",
            tried.join("; ")
        )
    }

    /// NCCL from `path` (a file, or a name the system's loader resolves).
    pub fn load(path: &Path) -> Result<Nccl> {
        // SAFETY: loading NCCL runs its initialisers, which only register the library.
        let lib = unsafe { libloading::Library::new(path) }.map_err(|e| anyhow::anyhow!("{e}"))?;
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the type is the entry point's signature in nccl.h.
                *unsafe { lib.get(concat!($name, "\0").as_bytes()) }
                    .with_context(|| format!("{} has no `{}`", path.display(), $name))?
            };
        }
        let api = Api {
            get_version: sym!("ncclGetVersion"),
            get_unique_id: sym!("ncclGetUniqueId"),
            comm_init_rank: sym!("ncclCommInitRank"),
            comm_destroy: sym!("ncclCommDestroy"),
            comm_abort: sym!("ncclCommAbort"),
            get_error_string: sym!("ncclGetErrorString"),
            all_reduce: sym!("ncclAllReduce"),
            reduce_scatter: sym!("ncclReduceScatter"),
            all_gather: sym!("ncclAllGather"),
            broadcast: sym!("ncclBroadcast"),
        };
        let mut version = 0;
        // SAFETY: writes one int.
        let code = unsafe { (api.get_version)(&mut version) };
        let nccl = Nccl {
            api,
            path: path.display().to_string(),
            version,
            _lib: lib,
        };
        nccl.check(code, "ncclGetVersion")?;
        Ok(nccl)
    }

    /// `2.21.5` from [`Nccl::version`].
    pub fn version_text(&self) -> String {
        let v = self.version;
        format!("{}.{}.{}", v / 10000, v / 100 % 100, v % 100)
    }

    fn check(&self, code: c_int, what: &str) -> Result<()> {
        if code == 0 {
            return Ok(());
        }
        // SAFETY: NCCL returns a static C string for every result code.
        let text = unsafe { CStr::from_ptr((self.api.get_error_string)(code)) };
        bail!(
            "{what} failed: {} (NCCL error {code})",
            text.to_string_lossy()
        )
    }

    /// A fresh id for a communicator (rank 0 makes it; the others receive it).
    pub fn unique_id(&self) -> Result<UniqueId> {
        let mut id = UniqueId { internal: [0; 128] };
        // SAFETY: writes the 128-byte id.
        let code = unsafe { (self.api.get_unique_id)(&mut id) };
        self.check(code, "ncclGetUniqueId")?;
        Ok(id)
    }

    /// Rank `rank` of the `world` ranks of communicator `id`; blocks until every rank called it.
    /// The CUDA context of this rank's device must be current on the calling thread.
    pub fn communicator(
        self: &Arc<Self>,
        id: &UniqueId,
        world: usize,
        rank: usize,
    ) -> Result<Communicator> {
        let mut comm: Comm = std::ptr::null_mut();
        // SAFETY: writes the communicator handle; `id` is passed by value as nccl.h declares.
        let code =
            unsafe { (self.api.comm_init_rank)(&mut comm, world as c_int, *id, rank as c_int) };
        self.check(code, &format!("ncclCommInitRank (rank {rank} of {world})"))?;
        Ok(Communicator {
            nccl: self.clone(),
            comm,
            world,
        })
    }
}

/// One rank's membership of an NCCL communicator.
pub struct Communicator {
    nccl: Arc<Nccl>,
    comm: Comm,
    world: usize,
}

// SAFETY: an NCCL communicator may be used from any thread, one operation at a time (which
// `&mut self` on every operation ensures).
unsafe impl Send for Communicator {}

impl Communicator {
    /// The number of ranks.
    pub fn world(&self) -> usize {
        self.world
    }

    /// `recv[i] = Σ_ranks send[i]` for `count` f32 values at device addresses `send` and `recv`
    /// (the same address: in place), queued on `stream`, bucket by bucket.
    ///
    /// # Safety
    /// `send` and `recv` hold `count` f32 values on this rank's device, and stay valid (and
    /// unwritten by others) until `stream` has run the queued operations.
    pub unsafe fn all_reduce_sum_f32(
        &mut self,
        send: u64,
        recv: u64,
        count: usize,
        stream: Stream,
    ) -> Result<()> {
        let (api, comm) = (&self.nccl.api, self.comm);
        self.bucketed(send, recv, count, "ncclAllReduce", |s, r, len| {
            // SAFETY: as this function's contract.
            unsafe { (api.all_reduce)(s, r, len, NCCL_FLOAT32, NCCL_SUM, comm, stream) }
        })
    }

    /// `recv` = this rank's `recv_count` values of the element-wise sum of every rank's `send`
    /// (`world × recv_count` values, rank r's segment at `r × recv_count`), queued on `stream`.
    ///
    /// # Safety
    /// As [`Communicator::all_reduce_sum_f32`], with `send` holding `world × recv_count` values
    /// and `recv` `recv_count`.
    pub unsafe fn reduce_scatter_sum_f32(
        &mut self,
        send: u64,
        recv: u64,
        recv_count: usize,
        stream: Stream,
    ) -> Result<()> {
        // SAFETY: as this function's contract.
        let code = unsafe {
            (self.nccl.api.reduce_scatter)(
                offset(send, 0),
                recv as *mut c_void,
                recv_count,
                NCCL_FLOAT32,
                NCCL_SUM,
                self.comm,
                stream,
            )
        };
        self.nccl.check(code, "ncclReduceScatter")
    }

    /// `recv` = every rank's `send_count` values of `send`, in rank order, queued on `stream`.
    ///
    /// # Safety
    /// As [`Communicator::all_reduce_sum_f32`], with `send` holding `send_count` values and
    /// `recv` `world × send_count`.
    pub unsafe fn all_gather_f32(
        &mut self,
        send: u64,
        recv: u64,
        send_count: usize,
        stream: Stream,
    ) -> Result<()> {
        // SAFETY: as this function's contract.
        let code = unsafe {
            (self.nccl.api.all_gather)(
                offset(send, 0),
                recv as *mut c_void,
                send_count,
                NCCL_FLOAT32,
                self.comm,
                stream,
            )
        };
        self.nccl.check(code, "ncclAllGather")
    }

    /// `recv` = rank `root`'s `send` (`count` values) on every rank, queued on `stream`.
    ///
    /// # Safety
    /// As [`Communicator::all_reduce_sum_f32`].
    pub unsafe fn broadcast_f32(
        &mut self,
        send: u64,
        recv: u64,
        count: usize,
        root: usize,
        stream: Stream,
    ) -> Result<()> {
        let (api, comm) = (&self.nccl.api, self.comm);
        self.bucketed(send, recv, count, "ncclBroadcast", |s, r, len| {
            // SAFETY: as this function's contract.
            unsafe { (api.broadcast)(s, r, len, NCCL_FLOAT32, root as c_int, comm, stream) }
        })
    }

    /// `call(send, recv, len)` for each bucket of a flat buffer of `count` values.
    fn bucketed(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        what: &str,
        call: impl Fn(*const c_void, *mut c_void, usize) -> c_int,
    ) -> Result<()> {
        for (start, len) in buckets(count) {
            let code = call(offset(send, start), offset(recv, start) as *mut c_void, len);
            self.nccl.check(code, what)?;
        }
        Ok(())
    }

    /// Leaves the communicator at once, without waiting for the other ranks (a failed run).
    pub fn abort(mut self) {
        // SAFETY: the handle is valid and not used again.
        unsafe { (self.nccl.api.comm_abort)(self.comm) };
        self.comm = std::ptr::null_mut();
    }
}

impl Drop for Communicator {
    fn drop(&mut self) {
        if !self.comm.is_null() {
            // SAFETY: the handle is valid and not used again.
            unsafe { (self.nccl.api.comm_destroy)(self.comm) };
        }
    }
}

/// The device address `base` advanced by `values` f32 values.
fn offset(base: u64, values: usize) -> *const c_void {
    (base + 4 * values as u64) as *const c_void
}

/// `(start, len)` of the buckets of a flat buffer of `count` values: [`BUCKET_VALUES`] each,
/// the last one shorter; one empty bucket for an empty buffer (every rank still calls NCCL).
pub fn buckets(count: usize) -> Vec<(usize, usize)> {
    if count == 0 {
        return vec![(0, 0)];
    }
    (0..count)
        .step_by(BUCKET_VALUES)
        .map(|start| (start, BUCKET_VALUES.min(count - start)))
        .collect()
}

/// Where to look for NCCL, in order (`env` reads a variable): `FLOWRL_NCCL`; the sonames
/// `libnccl.so.2` and `libnccl.so` for the system's loader; every `nvidia/nccl/lib/libnccl.so.2`
/// of a Python environment's `site-packages` or `dist-packages` (`VIRTUAL_ENV`, `CONDA_PREFIX`,
/// `~/.local`, `/usr/local`, `/usr`, `/opt/conda`).
pub fn candidates(env: &dyn Fn(&str) -> Option<PathBuf>) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = env("FLOWRL_NCCL").into_iter().collect();
    out.push("libnccl.so.2".into());
    out.push("libnccl.so".into());
    let mut prefixes: Vec<PathBuf> = ["VIRTUAL_ENV", "CONDA_PREFIX"]
        .into_iter()
        .filter_map(env)
        .collect();
    if let Some(home) = env("HOME") {
        prefixes.push(home.join(".local"));
    }
    prefixes.extend(["/usr/local", "/usr", "/opt/conda"].map(PathBuf::from));
    for prefix in prefixes {
        let Ok(entries) = std::fs::read_dir(prefix.join("lib")) else {
            continue;
        };
        let mut pythons: Vec<PathBuf> = entries
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("python3"))
            })
            .collect();
        pythons.sort();
        for python in pythons {
            for packages in ["site-packages", "dist-packages"] {
                let lib = python.join(packages).join("nvidia/nccl/lib/libnccl.so.2");
                if lib.is_file() && !out.contains(&lib) {
                    out.push(lib);
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_the_buffer_once() {
        assert_eq!(buckets(0), vec![(0, 0)]);
        assert_eq!(buckets(5), vec![(0, 5)]);
        let n = 2 * BUCKET_VALUES + 3;
        assert_eq!(
            buckets(n),
            vec![
                (0, BUCKET_VALUES),
                (BUCKET_VALUES, BUCKET_VALUES),
                (2 * BUCKET_VALUES, 3)
            ]
        );
    }

    #[test]
    fn a_unique_id_survives_the_f32_broadcast() {
        let mut id = UniqueId { internal: [0; 128] };
        for (i, b) in id.internal.iter_mut().enumerate() {
            // Every byte value, NaN bit patterns among them.
            *b = (i * 2 + 255) as u8 as c_char;
        }
        let back = UniqueId::from_f32s(&id.to_f32s()).unwrap();
        assert_eq!(back.internal, id.internal);
        assert!(UniqueId::from_f32s(&[0.0; 31]).is_err());
    }

    #[test]
    fn the_soname_and_the_wheels_are_candidates_and_a_missing_nccl_names_the_package() {
        let dir = tempfile::tempdir().unwrap();
        let venv = dir.path().join("venv");
        let wheel = venv.join("lib/python3.12/site-packages/nvidia/nccl/lib");
        std::fs::create_dir_all(&wheel).unwrap();
        // Not a library: found where a wheel puts it, then refused by the loader.
        std::fs::write(wheel.join("libnccl.so.2"), b"not an ELF file").unwrap();
        let chosen = dir.path().join("chosen.so");
        let env = |k: &str| match k {
            "VIRTUAL_ENV" => Some(venv.clone()),
            "FLOWRL_NCCL" => Some(chosen.clone()),
            _ => None,
        };
        let list = candidates(&env);
        assert_eq!(list[0], chosen);
        assert_eq!(list[1], PathBuf::from("libnccl.so.2"));
        assert!(list.contains(&wheel.join("libnccl.so.2")), "{list:?}");
        let only_ours = [chosen.clone(), wheel.join("libnccl.so.2")];
        let err = format!("{:#}", Nccl::load_first(&only_ours).unwrap_err());
        assert!(err.starts_with("NCCL (libnccl.so.2) is needed"), "{err}");
        assert!(
            err.contains("libnccl2") && err.contains("nvidia-nccl-cu12"),
            "{err}"
        );
        assert!(
            err.contains(&wheel.join("libnccl.so.2").display().to_string()),
            "{err}"
        );
        assert_eq!(err.lines().count(), 1, "{err}");
    }
}
