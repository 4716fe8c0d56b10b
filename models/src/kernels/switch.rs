//! Whether a kernel runs: the process-wide switch, and the type-id tests that tell which backend
//! a generic `B` is ([`super::on_cube!`] builds on them).

/// Whether flowrl's kernels are used (the default). `FLOWRL_KERNELS=off` in the environment, or
/// [`set_enabled`]`(false)`, sends every layer to its composite and generation to the host
/// sampler: the GPU path as it was before these kernels, for comparisons and for ruling a
/// kernel out when a result looks wrong.
pub fn enabled() -> bool {
    use std::sync::atomic::Ordering;
    match KERNELS.load(Ordering::Relaxed) {
        ON => true,
        OFF => false,
        _ => {
            let off = std::env::var("FLOWRL_KERNELS")
                .is_ok_and(|v| matches!(v.as_str(), "off" | "0" | "false"));
            KERNELS.store(if off { OFF } else { ON }, Ordering::Relaxed);
            !off
        }
    }
}

/// Turns flowrl's kernels on or off for the rest of the process (see [`enabled`]).
pub fn set_enabled(on: bool) {
    KERNELS.store(
        if on { ON } else { OFF },
        std::sync::atomic::Ordering::Relaxed,
    );
}

const ON: u8 = 1;
const OFF: u8 = 2;
static KERNELS: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// Whether `A` and `B` are the same type.
#[allow(dead_code)]
pub(crate) fn same<A: 'static, B: 'static>() -> bool {
    std::any::TypeId::of::<A>() == std::any::TypeId::of::<B>()
}

/// `a` as a `B`: only valid after [`same`] said they are one type (panics otherwise).
#[allow(dead_code)]
pub(crate) fn cast<A: 'static, B: 'static>(a: A) -> B {
    let boxed: Box<dyn std::any::Any> = Box::new(a);
    match boxed.downcast::<B>() {
        Ok(b) => *b,
        Err(_) => panic!(
            "kernel dispatch: {} is not {}",
            std::any::type_name::<A>(),
            std::any::type_name::<B>()
        ),
    }
}
