"""Pure renderers: inputs in, bytes out, no I/O.

`payload.render_payload` turns a NodePool's inputs into its Ignition payload;
`spec` knows the Ignition spec versions 3.0-3.6 (what each can express, canonical bytes,
negotiation) and `validation` what the Ignition client refuses on top of that;
`machineconfig` merges MachineConfigs into one Ignition config.
"""
