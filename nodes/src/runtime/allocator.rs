//! The memory allocator of flowrl's binaries: mimalloc, told to keep freed memory.
//!
//! A training step frees and re-allocates the same large buffers (activations, LM-head blocks)
//! every micro-batch. glibc's malloc serves every block above its mmap threshold (32 MiB at most)
//! with a fresh `mmap` and returns it with `munmap`, so each one comes back as new pages that the
//! kernel has to fault in and zero. mimalloc with purging disabled reuses the freed pages
//! instead; the price is that the process keeps its high-water mark of memory, as PyTorch's
//! caching allocators do on GPUs. The measurements are in bench/results/profile.md.
//!
//! A binary opts in (libraries do not choose the allocator of their users): a plugin binary's
//! `flowrl_nodes::plugin_main!` does both steps; a binary with its own `main` writes
//!
//! ```ignore
//! flowrl_nodes::global_allocator!();
//! // first thing in main():
//! flowrl_nodes::runtime::allocator::keep_freed_memory();
//! ```
//!
//! `MIMALLOC_*` environment variables are read at start-up, before `main`; the call overrides
//! `MIMALLOC_PURGE_DELAY` unless `FLOWRL_ALLOCATOR_PURGE` is set (then the environment wins, e.g.
//! `MIMALLOC_PURGE_DELAY=1000`, mimalloc's default, to hand memory back after a second at the cost
//! of the page faults).

pub use mimalloc::MiMalloc;

/// `mi_option_purge_delay` in mimalloc's `mi_option_t` (include/mimalloc.h of mimalloc 2.x and
/// 3.x, both bundled by libmimalloc-sys 0.1.49: the 16th option, after the four
/// `deprecated_*` placeholders). libmimalloc-sys names no constant for it.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Tells mimalloc never to return freed memory to the OS (purge delay −1). Harmless when the
/// binary's global allocator is not mimalloc (only mimalloc's own heap reads the option).
pub fn keep_freed_memory() {
    if std::env::var_os("FLOWRL_ALLOCATOR_PURGE").is_some() {
        return;
    }
    // SAFETY: setting an option is a plain store into mimalloc's option table; mimalloc allows
    // it at any time.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1) };
}

#[cfg(test)]
mod tests {
    #[test]
    fn purge_delay_is_the_option_set() {
        // SAFETY (both blocks): reading an option.
        let default = unsafe { libmimalloc_sys::mi_option_get(super::MI_OPTION_PURGE_DELAY) };
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
            assert_eq!(
                default, 1000,
                "option 15 is not purge_delay (default 1000 ms in mimalloc 3)"
            );
        }
        super::keep_freed_memory();
        let v = unsafe { libmimalloc_sys::mi_option_get(super::MI_OPTION_PURGE_DELAY) };
        assert_eq!(v, -1);
    }
}
