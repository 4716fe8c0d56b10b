//! Stage 3, placement: the run's devices (`[run] device` or `[run] devices`: device strings,
//! distinct, of one type, present on the target machine) and each node's and resource's `device`
//! (present, and one of the run's devices).
//!
//! Value types were checked by the shape stage, which this stage does not report again. Which
//! replicas run where is decided later ([`crate::placement`]); this stage only checks that the
//! devices named can be used.

use crate::device::{DeviceRequest, DeviceSpec, Machine, Unavailable};
use crate::diagnostic::{Code, Diagnostic, Span};
use crate::params::{ParamSpec, ParamType};
use crate::spec::{SEntry, SKind, STable};

use super::nodes::NodeDraft;
use super::resources::ResourceDraft;

/// The target the devices are checked against.
pub(super) struct Placement {
    /// The machine devices are checked against.
    machine: Machine,
}

impl Placement {
    pub fn new(machine: Machine) -> Self {
        Placement { machine }
    }

    /// The `[run]` keys this stage reads, as parameters of the section.
    pub fn run_specs() -> Vec<ParamSpec> {
        vec![
            ParamSpec::string("device")
                .default("auto")
                .doc("`auto` | `cpu` | `cpu:N` | `cuda` | `cuda:N` | `vulkan` | `vulkan:N`; `auto` is CUDA when built with it and a GPU is present; short for `devices = [\"X\"]`"),
            ParamSpec::array("devices", ParamType::String).doc(
                "the devices of this process, all CPU replicas or all GPUs (`[\"cuda:0\", \"cuda:1\"]`): data-parallel nodes run one replica on each; instead of `device`",
            ),
        ]
    }

    /// `[run] device` or `[run] devices`, resolved on the target machine (`auto` without
    /// either); `None` after any error, here or in the shape of `[run]`.
    pub fn check_run(&self, doc: &STable, diags: &mut Vec<Diagnostic>) -> Option<Vec<DeviceSpec>> {
        let empty = STable::default();
        let table = match doc.get("run") {
            Some(e) => match &e.value.kind {
                SKind::Table(t) => t,
                // Not a table: reported by the shape stage.
                _ => return None,
            },
            None => &empty,
        };
        let errors = diags.len();
        let (one, list) = (table.get("device"), table.get("devices"));
        if let (Some(one), Some(list)) = (one, list) {
            diags.push(self.device_conflict(one, list));
            return None;
        }
        let Some(list) = list else {
            let Some(one) = one else {
                return Some(vec![self.auto()]);
            };
            let req = parse_device(one.value.as_str()?, one.value.span, diags)?;
            return self
                .resolve_run_device(req, one.value.span, diags)
                .map(|d| vec![d]);
        };
        // Not an array of strings: reported by the shape stage.
        let SKind::Array(items) = &list.value.kind else {
            return None;
        };
        if items.iter().any(|i| i.as_str().is_none()) {
            return None;
        }
        if items.is_empty() {
            diags.push(
                Diagnostic::bad_device_list("`[run] devices` is empty", list.value.span).with_help(
                    "list the devices of this process, e.g. `devices = [\"cpu:0\", \"cpu:1\"]`",
                ),
            );
            return None;
        }
        // Duplicates and mixed types are mistakes on any machine: checked on the devices as
        // written, before each is looked up on the target machine.
        let mut listed: Vec<(DeviceRequest, DeviceSpec, Span)> = Vec::new();
        for item in items {
            let Some(req) = parse_device(item.as_str().expect("checked above"), item.span, diags)
            else {
                continue;
            };
            let d = match req {
                DeviceRequest::Device(d) => d,
                DeviceRequest::Auto => {
                    diags.push(
                        Diagnostic::bad_device_list(
                            "`auto` cannot be one of `[run] devices`",
                            item.span,
                        )
                        .with_help(
                            "`auto` picks one device: write `device = \"auto\"`, or list the devices",
                        ),
                    );
                    continue;
                }
            };
            if let Some((_, _, first)) = listed.iter().find(|(_, e, _)| *e == d) {
                diags.push(
                    Diagnostic::bad_device_list(
                        format!("`[run] devices` lists {d} twice"),
                        item.span,
                    )
                    .with_note(*first, "first listed here")
                    .with_help("each device runs one replica; list it once"),
                );
                continue;
            }
            if let Some((_, first, first_span)) = listed.first()
                && first.type_name() != d.type_name()
            {
                diags.push(
                    Diagnostic::bad_device_list(
                        format!(
                            "`[run] devices` mixes {} and {} devices",
                            first.type_name(),
                            d.type_name()
                        ),
                        item.span,
                    )
                    .with_note(
                        *first_span,
                        format!("{first} is a {} device", first.type_name()),
                    )
                    .with_help(
                        "the replicas of a run are all CPU replicas (`cpu:N`), all GPUs (`cuda:N`) or all Vulkan adapters (`vulkan:N`)",
                    ),
                );
                continue;
            }
            listed.push((req, d, item.span));
        }
        // Devices missing for one reason (a binary built without CUDA, say): one error.
        let mut devices = Vec::new();
        let mut missing: Vec<(Unavailable, Vec<(DeviceRequest, Span)>)> = Vec::new();
        for (req, _, span) in listed {
            match self.machine.resolve(req) {
                Ok(d) => devices.push(d),
                Err(why) => match missing.iter_mut().find(|(w, _)| *w == why) {
                    Some((_, reqs)) => reqs.push((req, span)),
                    None => missing.push((why, vec![(req, span)])),
                },
            }
        }
        for (why, reqs) in missing {
            match reqs.as_slice() {
                [(req, span)] => {
                    diags.push(Diagnostic::device_unavailable("the run", *req, why, *span))
                }
                _ => {
                    let names: Vec<String> = reqs.iter().map(|(r, _)| r.to_string()).collect();
                    diags.push(
                        Diagnostic::error(
                            Code::DeviceUnavailable,
                            format!("the run is placed on {}, but {why}", names.join(", ")),
                        )
                        .at(list.value.span)
                        .with_help(why.help()),
                    );
                }
            }
        }
        (diags.len() == errors).then_some(devices)
    }

    /// Each node's `device`, resolved and checked against the run's devices (`None` for a node
    /// without one, or after an error).
    pub fn check_nodes(
        &self,
        nodes: &[NodeDraft<'_>],
        run_devices: Option<&[DeviceSpec]>,
        diags: &mut Vec<Diagnostic>,
    ) -> Vec<Option<DeviceSpec>> {
        nodes
            .iter()
            .map(|n| {
                let subject = format!("node `{}`", n.name);
                let instead = "remove the node's `device` to run it on the run's devices";
                self.check_pinned(&subject, instead, n.device, run_devices, diags)
            })
            .collect()
    }

    /// Each resource's `device`, as [`Placement::check_nodes`] checks the nodes'.
    pub fn check_resources(
        &self,
        resources: &[ResourceDraft],
        run_devices: Option<&[DeviceSpec]>,
        diags: &mut Vec<Diagnostic>,
    ) -> Vec<Option<DeviceSpec>> {
        resources
            .iter()
            .map(|r| {
                let subject = format!("resource `{}`", r.name);
                let instead =
                    "remove the resource's `device` to place it on the run's first device";
                self.check_pinned(&subject, instead, r.device, run_devices, diags)
            })
            .collect()
    }

    /// `subject`'s `device` (as written), resolved on the target machine and checked to be one
    /// of the run's devices (the help's alternative: `instead`).
    fn check_pinned(
        &self,
        subject: &str,
        instead: &str,
        device: Option<(DeviceRequest, Span)>,
        run_devices: Option<&[DeviceSpec]>,
        diags: &mut Vec<Diagnostic>,
    ) -> Option<DeviceSpec> {
        let (req, span) = device?;
        let d = match self.machine.resolve(req) {
            Ok(d) => d,
            Err(why) => {
                diags.push(Diagnostic::device_unavailable(subject, req, why, span));
                return None;
            }
        };
        if let Some(run) = run_devices
            && !run.contains(&d)
        {
            diags.push(
                Diagnostic::error(
                    Code::DeviceNotInRun,
                    format!(
                        "{subject} is placed on {d}, which is not one of the run's devices [{}]",
                        crate::device::device_list(run)
                    ),
                )
                .at(span)
                .with_help(format!("add {d} to `[run] devices`, or {instead}")),
            );
        }
        Some(d)
    }

    /// `auto` on the target machine.
    fn auto(&self) -> DeviceSpec {
        self.machine
            .resolve(DeviceRequest::Auto)
            .expect("auto always resolves")
    }

    /// A device of the run on the target machine (an error at `span` when it is not there).
    fn resolve_run_device(
        &self,
        req: DeviceRequest,
        span: Span,
        diags: &mut Vec<Diagnostic>,
    ) -> Option<DeviceSpec> {
        self.machine
            .resolve(req)
            .map_err(|why| diags.push(Diagnostic::device_unavailable("the run", req, why, span)))
            .ok()
    }

    /// `[run] device` and `[run] devices` both given: an error at the one given second (an
    /// override comes after the file).
    fn device_conflict(&self, one: &SEntry, list: &SEntry) -> Diagnostic {
        let key = |e: &SEntry| (e.key_span.source, e.key_span.start);
        let (first, second) = if key(one) <= key(list) {
            (one, list)
        } else {
            (list, one)
        };
        Diagnostic::error(
            Code::DeviceConflict,
            "`[run] device` and `[run] devices` are both given",
        )
        .at(second.key_span)
        .with_note(first.key_span, format!("`{}` is given here", first.key))
        .with_help("`device = \"X\"` is short for `devices = [\"X\"]`; keep one of them")
    }
}

/// A device string (an error at `span` when it is not one).
fn parse_device(text: &str, span: Span, diags: &mut Vec<Diagnostic>) -> Option<DeviceRequest> {
    text.parse::<DeviceRequest>()
        .map_err(|msg| diags.push(Diagnostic::invalid_value(msg, span)))
        .ok()
}
