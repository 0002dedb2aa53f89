"""What each pod was given: vGPU shares per GPU, and the ratio file."""
