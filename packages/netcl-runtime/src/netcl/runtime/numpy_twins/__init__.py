"""The NumPy backend's twins of the eager ops, one module per op module of ``netcl.runtime.ops``.

Each function here has the name and parameters of an OpenCL implementation declared with
``netcl.runtime.ops.backend.backend_op`` and runs when that op is called on the NumPy backend's
device (its kind is ``ops.backend.NUMPY_KIND``). Values are computed as the kernels compute them (float32 for
float32/float16 data, float64 for float64), so both backends agree within float32 rounding.
"""
