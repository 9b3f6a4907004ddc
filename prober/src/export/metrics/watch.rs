//! [`Watched`]: a connection's TCP stream with a write timeout. A write
//! that cannot proceed (the socket's send buffer is full: the client does
//! not read) fails after the write timeout without progress, and the
//! connection's slot knows it is stalled meanwhile, so that the cap can
//! close it for a connection that will read. A connection closed while
//! stalled is reset (SO_LINGER 0): the kernel drops what the client never
//! read instead of holding it, and retrying, after the close.

use std::{
    io,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::slots::Slot;

pub(super) struct Watched {
    stream: tokio::net::TcpStream,
    slot: Arc<Slot>,
    timeout: Duration,
    /// Armed by a write that could not proceed, disarmed by progress.
    stall: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Watched {
    pub(super) fn new(stream: tokio::net::TcpStream, slot: Arc<Slot>, timeout: Duration) -> Self {
        Self {
            stream,
            slot,
            timeout,
            stall: None,
        }
    }

    /// A write's outcome, with the timeout applied to one that waits.
    fn watch(
        &mut self,
        cx: &mut Context<'_>,
        r: Poll<io::Result<usize>>,
    ) -> Poll<io::Result<usize>> {
        if r.is_ready() {
            if self.stall.take().is_some() {
                self.slot.reading();
            }
            return r;
        }
        let (slot, timeout) = (&self.slot, self.timeout);
        let stall = self.stall.get_or_insert_with(|| {
            slot.stalled();
            Box::pin(tokio::time::sleep(timeout))
        });
        match stall.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the client read nothing for {timeout:?}"),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        if self.stall.is_some() {
            let _ = self.stream.set_zero_linger();
        }
    }
}

impl AsyncRead for Watched {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.stream).poll_write(cx, buf);
        this.watch(cx, r)
    }

    /// Vectored, as the stream is: hyper then writes the shared page from
    /// where it is instead of copying it into a buffer of its own.
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.stream).poll_write_vectored(cx, bufs);
        this.watch(cx, r)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}
