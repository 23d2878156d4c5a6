// A service or client imports CanopyBus alone: the transport (contexts, CurveZMQ keys) and
// the wire types it names come with it.
@_exported import CanopyIO
@_exported import CanopyWire
