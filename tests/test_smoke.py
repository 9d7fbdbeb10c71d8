def test_import():
    import netcl.core.__about__ as a

    assert a.__version__
