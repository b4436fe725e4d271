"""The local demo: tiny real repositories, a scripted policy, and the run that ties them up."""
