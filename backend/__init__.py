"""Everything that runs where tritonserver runs: the `tidepool` backend and its launcher."""
