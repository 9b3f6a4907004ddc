//! Where a knob acts: a namespace, reached through the kernel layer.

use crate::sys::{Ns, Sys};

/// A namespace and the [`Sys`] that reaches it.
#[derive(Clone, Copy)]
pub(crate) struct At<'a> {
    pub(crate) sys: &'a dyn Sys,
    pub(crate) ns: Ns<'a>,
}

impl<'a> At<'a> {
    pub(crate) fn new(sys: &'a dyn Sys, ns: Ns<'a>) -> Self {
        Self { sys, ns }
    }

    /// The namespace's name, for metadata and messages.
    pub(crate) fn name(&self) -> String {
        self.ns.label()
    }
}
