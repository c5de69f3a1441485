"""Models: the architectures wsym ships, the one registry of model specs, how a module is called."""
