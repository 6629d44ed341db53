"""Pure renderers: inputs in, bytes out, no I/O.

`payload.render_payload` turns a NodePool's inputs into its Ignition payload;
`spec` knows the Ignition spec versions 3.0-3.6 (what each can express, validation);
`machineconfig` merges MachineConfigs into one Ignition config.
"""
