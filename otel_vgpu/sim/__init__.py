"""The simulated GPU node: scenario files and the node that runs them."""
