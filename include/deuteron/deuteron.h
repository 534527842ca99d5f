// Deuteron: write a kernel once in a PyTorch-style tile language, run it fast anywhere.
#pragma once

#include "deuteron/dtype.h"
#include "deuteron/error.h"
#include "deuteron/hl.h"
#include "deuteron/kernel.h"
#include "deuteron/tensor.h"
