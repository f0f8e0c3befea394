"""Front ends: wire codecs and thin handlers over :class:`infermux.dataplane.DataPlane`."""
