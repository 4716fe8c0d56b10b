//! Every policy loss of verl's registry computed in float64 against the `_f64` vectors, the
//! f32-sensitive results included (see `policy_loss_registry/mod.rs`). The Flex device's
//! default float type is set to f64 for this whole test binary.

mod policy_loss_registry;

#[test]
fn policy_loss_registry_vectors_f64() {
    policy_loss_registry::run(policy_loss_registry::Float::F64);
}
