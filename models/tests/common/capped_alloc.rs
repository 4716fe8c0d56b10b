//! The global allocator of the fuzz test binaries: memory stays bounded, so a config or header
//! that claims a huge size aborts the run instead of exhausting the machine.

use std::alloc::{GlobalAlloc, Layout, System};

/// The system allocator, refusing (null → abort) any single allocation over 2 GiB.
struct Capped;
const CAP: usize = 2 << 30;
unsafe impl GlobalAlloc for Capped {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if l.size() > CAP {
            return std::ptr::null_mut();
        }
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        if l.size() > CAP {
            return std::ptr::null_mut();
        }
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        if new > CAP {
            return std::ptr::null_mut();
        }
        unsafe { System.realloc(p, l, new) }
    }
}
#[global_allocator]
static ALLOC: Capped = Capped;
