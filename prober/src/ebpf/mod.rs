mod setup;
pub use setup::{XdpSetup, attach_for_testbed};
