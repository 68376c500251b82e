#pragma once
// The image layer (CMake target sluice::image): JPEG/PNG decoding, augmentation, image
// batches. Needs libjpeg-turbo, libspng and OpenCV's imgproc (README, "Images").

#include <sluice/image/augment.hpp>
#include <sluice/image/codec.hpp>
#include <sluice/image/images.hpp>
