//! On-demand loads (`load --lazy`, issue 30): the nodes of a job share one pool file on shared
//! storage chunk by chunk; see [`exchange`].

pub mod exchange;
pub mod launch;
pub mod prefetch;
pub mod serve;
pub mod view_serve;
